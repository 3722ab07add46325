"""The training pass's LM head on a CPU: TRL's fused head, with the logits kept for the backward pass.

TRL's fused LM head (`trl.kernels.ChunkedLogProbFunction`, what `fused_lm_head=True` runs) projects the
positions onto the vocabulary one tile of `chunk_size` columns at a time (trainer.py sets 512) and folds each
tile into online-logsumexp statistics, so the [positions, vocabulary] logits never exist at once. Its backward
projects every tile a second time and turns it into the logits' gradient in place.

`KeptTilesLogProb` is that function on devices without Triton (TRL's torch path, the CPU), except that the
forward keeps each tile and the backward reuses it instead of projecting again. Everything else is TRL's own
code: the tiles are the same products of the same inputs, folded by TRL's `_forward_tile` and turned into the
gradient by TRL's `_backward_tile`, in the same order; log-probabilities, entropies and gradients are equal bit
for bit (tests/test_lm_head.py). One matrix product per tile fewer, of the three a tile costs (the frozen head
of SmolLM2 has no weight gradient): measured on the progressive preset's groups, the training pass 0.969x as long
(bench/bucket_lengths.py '/reproject'; docs/experiments.md, 2026-12-02). The cost is memory:
the logits of a micro-batch's positions are held from its forward to its backward, positions x vocabulary x 4
bytes (the progressive preset, 8 answers of up to 96 tokens: up to ~150 MB), within a budget
(`estimate.KEPT_LOGITS_BYTES`): a call whose logits would take the calls kept so far past it runs as TRL's. Only a
forward that will be differentiated keeps them.

`keep_logits(budget)` turns it on for the calls made inside it (the trainer: one micro-batch's training pass, per
`EngineOptions.keep_lm_head_logits`); elsewhere, and on Triton devices, TRL's function runs unchanged.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import trl.trainer.utils as _trl_utils
from trl.kernels.chunked_logprob import (
    OPTIONAL_OUTPUTS,
    TOKEN_CHUNK_SIZE,
    ChunkedLogProbFunction,
    _addmm_fp32,
    _backward_tile,
    _forward_tile,
    _use_triton,
)

_state = threading.local()


@contextlib.contextmanager
def keep_logits(budget_bytes: int):
    """Inside: the fused LM head keeps its logits tiles for backward (where TRL's torch path would run), as long as
    the logits kept by the calls inside stay within `budget_bytes` (0: none kept)."""
    before = getattr(_state, "budget", None)
    _state.budget = [int(budget_bytes), 0]  # [budget, bytes kept so far]
    try:
        yield
    finally:
        _state.budget = before


def kept_bytes() -> int:
    """The logits kept so far inside the innermost `keep_logits` (0 outside)."""
    budget = getattr(_state, "budget", None)
    return budget[1] if budget else 0


class KeptTilesLogProb(torch.autograd.Function):
    """TRL's `ChunkedLogProbFunction` (torch path), keeping each projected tile for the backward pass."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
                logit_scale=1.0, outputs=OPTIONAL_OUTPUTS):
        ctx.set_materialize_grads(False)
        device = hidden.device
        n_all, vocab = hidden.shape[0], weight.shape[0]
        compute_dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
        kernel_args = {
            "logit_scale": logit_scale,
            "softcap": final_logit_softcapping or 1.0,
            "inv_t": 1 / temperature,
            "HAS_SOFTCAP": final_logit_softcapping is not None,
        }
        flags = {f"HAS_{name.upper()}": name in outputs for name in OPTIONAL_OUTPUTS}
        f32 = {"device": device, "dtype": torch.float32}
        running_max = torch.full((n_all,), float("-inf"), **f32)
        sum_exp, x_sum_exp = torch.zeros((n_all,), **f32), torch.zeros((n_all,), **f32)
        sq_sum_exp, z_sum = torch.zeros((n_all,), **f32), torch.zeros((n_all,), **f32)
        max_before_target = torch.full((n_all,), float("-inf"), **f32)
        target_logit = torch.zeros((n_all,), **f32)
        keep = any(ctx.needs_input_grad[:3])
        tiles = []
        rows = min(n_all, TOKEN_CHUNK_SIZE)
        for token_start in range(0, n_all, TOKEN_CHUNK_SIZE):
            token_end = min(token_start + TOKEN_CHUNK_SIZE, n_all)
            n = token_end - token_start
            hidden_chunk = hidden[token_start:token_end].to(compute_dtype)
            buf = None
            for start in range(0, vocab, chunk_size):
                end = min(start + chunk_size, vocab)
                if keep or buf is None:  # (TRL reuses one buffer; a kept tile needs its own, of the same layout)
                    buf = torch.empty((rows, chunk_size), device=device, dtype=compute_dtype)
                tile = buf[:n, : end - start]
                torch.mm(hidden_chunk, weight[start:end].to(compute_dtype).t(), out=tile)
                if bias is not None:
                    tile.add_(bias[start:end].to(compute_dtype))
                sl = slice(token_start, token_end)
                _forward_tile(tile, tile.stride(0), targets[sl], running_max[sl], sum_exp[sl], x_sum_exp[sl],
                              sq_sum_exp[sl], z_sum[sl], max_before_target[sl], target_logit[sl], start, end - start,
                              BLOCK_SIZE=1024, **flags, **kernel_args)
                if keep:
                    tiles.append(tile)
        log_z = running_max + torch.log(sum_exp)
        logprobs = target_logit - log_z
        entropy = log_z - x_sum_exp / sum_exp if "entropy" in outputs else None
        log_sum_sq_probs = torch.log(sq_sum_exp) - 2 * torch.log(sum_exp) if "log_sum_sq_probs" in outputs else None
        mean_logits = z_sum / vocab if "mean_logits" in outputs else None
        is_top1 = (target_logit >= running_max) & (target_logit > max_before_target) if "is_top1" in outputs else None
        ctx.save_for_backward(hidden, weight, bias, targets, log_z, log_z if entropy is None else entropy)
        ctx.tiles, ctx.chunk_size, ctx.kernel_args = tiles, chunk_size, kernel_args
        ctx.compute_dtype = compute_dtype
        ctx.mark_non_differentiable(*(x for x in (log_sum_sq_probs, mean_logits, is_top1) if x is not None))
        return logprobs, entropy, log_sum_sq_probs, mean_logits, is_top1

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy, *_):
        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        tiles, ctx.tiles = ctx.tiles, None  # each tile becomes its gradient in place, then is dropped
        chunk_size, compute_dtype = ctx.chunk_size, ctx.compute_dtype
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        n_all = hidden.shape[0]
        with _trl_utils.maybe_gather_lm_head_ctx(weight, bias):
            vocab = weight.shape[0]
            grad_hidden = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32) if needs_hidden else None
            grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if needs_weight else None
            grad_bias = torch.zeros(bias.shape, device=bias.device, dtype=torch.float32) if needs_bias else None
            grad_logprobs = grad_logprobs.float().contiguous() if grad_logprobs is not None else None
            grad_entropy = grad_entropy.float().contiguous() if grad_entropy is not None else None
            k = 0
            for token_start in range(0, n_all, TOKEN_CHUNK_SIZE):
                token_end = min(token_start + TOKEN_CHUNK_SIZE, n_all)
                sl = slice(token_start, token_end)
                hidden_chunk = hidden[sl].to(compute_dtype)
                for start in range(0, vocab, chunk_size):
                    end = min(start + chunk_size, vocab)
                    w_chunk = weight[start:end].to(compute_dtype)
                    tile, tiles[k] = tiles[k], None
                    k += 1
                    _backward_tile(tile, tile.stride(0), targets[sl], log_z[sl], entropy[sl],
                                   grad_logprobs[sl] if grad_logprobs is not None else log_z,
                                   grad_entropy[sl] if grad_entropy is not None else log_z, start, end - start,
                                   HAS_LOGPROB_GRAD=grad_logprobs is not None,
                                   HAS_ENTROPY_GRAD=grad_entropy is not None, BLOCK_SIZE=1024, **ctx.kernel_args)
                    if grad_hidden is not None:
                        _addmm_fp32(grad_hidden[sl], tile, w_chunk)
                    if grad_weight is not None:
                        _addmm_fp32(grad_weight[start:end], tile.t(), hidden_chunk)
                    if grad_bias is not None:
                        grad_bias[start:end] += tile.sum(dim=0, dtype=torch.float32)
        return (
            grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            None, None, None, None, None, None,
        )


class _Dispatch:
    """What TRL's fused forward calls (`trl.trainer.utils._ChunkedLogProbFunction`): the kept-tiles function inside
    `keep_logits(budget)` on a device without Triton when the result will be differentiated and its logits fit in
    what is left of the budget, else TRL's own."""

    @staticmethod
    def apply(hidden, weight, *args):
        budget = getattr(_state, "budget", None)
        if budget and torch.is_grad_enabled() and not _use_triton(hidden.device):
            dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) \
                else hidden.dtype
            nbytes = hidden.shape[0] * weight.shape[0] * dtype.itemsize
            if budget[1] + nbytes <= budget[0]:
                budget[1] += nbytes
                return KeptTilesLogProb.apply(hidden, weight, *args)
        return ChunkedLogProbFunction.apply(hidden, weight, *args)


def install() -> None:
    """Route TRL's fused LM head through `_Dispatch` (idempotent; TRL's function runs outside `keep_logits`)."""
    if getattr(_trl_utils, "_ChunkedLogProbFunction", None) is ChunkedLogProbFunction:
        _trl_utils._ChunkedLogProbFunction = _Dispatch
