"""`python -m grpo_app` for `torchrun` in the tests, with the tests' `text_length` reward registered (a
random model's completions differ in length, so groups get advantages and the weights really move).
At exit each process says on stderr whether it left the process group (the tests read it)."""

import atexit
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo_app.cli import main  # noqa: E402
from grpo_app.core.rewards import REWARD_FUNCS  # noqa: E402
from tests.conftest import text_length  # noqa: E402

REWARD_FUNCS["text_length"] = text_length


@atexit.register
def _say_whether_the_group_was_left():
    import torch.distributed as dist

    print(f"rank {os.environ.get('RANK')} exits in a process group: {dist.is_initialized()}", file=sys.stderr)


sys.exit(main(sys.argv[1:]))
