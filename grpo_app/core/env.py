"""Integer settings from the environment (server limits such as GRPO_APP_MAX_EVAL_N)."""

from __future__ import annotations

import os


def env_int(name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
    """An integer from the environment: `default` when unset or not a number, clamped to [lo, hi] when given."""
    try:
        v = int(os.environ.get(name, default))
    except ValueError:
        return default
    if lo is not None:
        v = max(lo, v)
    return v if hi is None else min(hi, v)
