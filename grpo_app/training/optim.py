"""Memory levers for CPU training: an AdamW with bfloat16 moment buffers, and heap trimming.

`AdamWBF16Moments` is torch's AdamW (decoupled weight decay, bias correction) except that its two
moment buffers are *stored* in bfloat16: half the optimizer memory (~400 MB less for SmolLM2-135M).
Every update is computed in float32 from float32 gradients and written to float32 weights; only the
running averages are rounded to bfloat16 (8 significant bits) between steps.

`trim_heap()` hands freed memory back to the OS (glibc keeps freed blocks; after a backward pass
that is ~0.5 GB of resident memory nobody uses). `held_heap()` does the opposite for a run that asks for it
(`grpo.keep_freed_memory`): freed memory stays in the process for the next micro-batch, step or sampling call,
and every trim is skipped while it holds. What it saves is page faults: each page handed back comes back zeroed, through
the kernel, the next time a tensor needs it. Measured on the progressive preset, seed 2, on a 2-core AMD EPYC
with AVX2 kernels, whole runs one after the other: 1412 s and 33 M page faults as before, 1212 s and 1.8 M held, the
same final model bit for bit, peak 3.13 -> 3.32 GB (docs/experiments.md, 2026-12-07).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math

import torch


class AdamWBF16Moments(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"learning rate must be > 0, got {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    def load_state_dict(self, state_dict):
        # torch casts floating-point state to each parameter's dtype on load; keep the moments bf16.
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state and state[key].dtype != torch.bfloat16:
                    state[key] = state[key].to(torch.bfloat16)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                t = float(state["step"])
                g = p.grad.float()
                m = state["exp_avg"].float().mul_(b1).add_(g, alpha=1 - b1)
                v = state["exp_avg_sq"].float().mul_(b2).addcmul_(g, g, value=1 - b2)
                state["exp_avg"].copy_(m)
                state["exp_avg_sq"].copy_(v)
                if wd:
                    p.mul_(1 - lr * wd)
                denom = v.sqrt_().div_(math.sqrt(1 - b2**t)).add_(eps)
                p.addcdiv_(m.to(p.dtype), denom.to(p.dtype), value=-lr / (1 - b1**t))
        return loss


def load_moments(optimizer, carried: dict) -> None:
    """Put the per-weight state of `carried` (an earlier optimizer's `state_dict()` over the same weights, in
    the same order: a stage's `carry_moments`) into `optimizer`, keeping `optimizer`'s own groups: its learning
    rate, weight decay and betas. Refused with a reason when the weights do not line up (another model, other
    trainable weights)."""
    own = optimizer.state_dict()
    sizes = [len(g["params"]) for g in own["param_groups"]]
    theirs = [len(g["params"]) for g in carried["param_groups"]]
    if sizes != theirs:
        raise ValueError(f"the carried optimizer moments are for groups of {theirs} weights, this optimizer has "
                         f"{sizes}: they come from another model or other trainable weights.")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, state in carried["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state and tuple(state[key].shape) != tuple(params[int(i)].shape):
                raise ValueError(f"the carried moment {key} of weight {i} has shape {tuple(state[key].shape)}, the "
                                 f"weight {tuple(params[int(i)].shape)}: they come from another model.")
    optimizer.load_state_dict({"state": carried["state"], "param_groups": own["param_groups"]})


_LIBC = None
_HELD = False  # True inside held_heap(): trims are skipped

# glibc's mallopt parameters, their defaults, and what held_heap() sets. glibc refuses an mmap threshold above half
# its heap size (32 MiB on 64-bit): blocks larger than that are still mapped and unmapped one by one.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
DEFAULT_TRIM_THRESHOLD = DEFAULT_MMAP_THRESHOLD = 128 * 1024
HELD_MMAP_THRESHOLD = 32 * 2**20
HELD_TRIM_THRESHOLD = 2**31 - 1  # (an int) freed memory at the heap's top is never handed back on its own


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return _LIBC


def trim_heap() -> bool:
    """Return freed heap memory to the OS (glibc only; a no-op elsewhere, and inside `held_heap`)."""
    if _HELD:
        return False
    try:
        return bool(_libc().malloc_trim(0))
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def held_heap(enabled: bool = True):
    """While it holds, glibc keeps what the process frees for its next allocations: blocks up to 32 MiB come from
    the heap (not mapped anew each time), the heap's top is not trimmed on its own, and `trim_heap` does nothing.
    Yields whether it holds (False when not enabled, or without glibc's mallopt). On exit glibc's default
    thresholds are set again (fixed at those values: glibc's own sliding of them is not restored) and the heap is
    trimmed once. The numbers a run computes are the same bit for bit: where memory comes from changes no
    arithmetic (every tensor is 64-byte aligned either way)."""
    global _HELD
    if not enabled or _HELD:  # (inside another hold: that one lets go)
        yield _HELD
        return
    try:
        libc = _libc()
        held = bool(libc.mallopt(M_MMAP_THRESHOLD, HELD_MMAP_THRESHOLD))
        held = held and bool(libc.mallopt(M_TRIM_THRESHOLD, HELD_TRIM_THRESHOLD))
    except (OSError, AttributeError):
        yield False
        return
    _HELD = held
    try:
        yield held
    finally:
        _HELD = False
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)  # (also after a refusal: nothing is left half set)
        libc.mallopt(M_MMAP_THRESHOLD, DEFAULT_MMAP_THRESHOLD)
        if held:
            trim_heap()
