"""`python -m grpo_app` for `torchrun` in the tests, with the tests' `text_length` reward registered (a
random model's completions differ in length, so groups get advantages and the weights really move)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo_app.cli import main  # noqa: E402
from grpo_app.core.rewards import REWARD_FUNCS  # noqa: E402
from tests.conftest import text_length  # noqa: E402

REWARD_FUNCS["text_length"] = text_length
sys.exit(main(sys.argv[1:]))
