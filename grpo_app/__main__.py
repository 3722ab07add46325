import sys

from grpo_app.cli import main

sys.exit(main())
