"""Training that keeps fewer activations: a SwiGLU MLP and an RMSNorm with their own backward.

Without gradient checkpointing, the activations a backward pass needs are most of a GRPO step's
memory on CPU (~1 MB per token for SmolLM2-135M in float32). Two blocks keep more than their
gradients need:

* HF's MLP, down(silu(gate(x)) * up(x)), keeps gate(x), silu(gate(x)), up(x) and their product:
  4 x intermediate floats per token. `_SwiGLUFunction` keeps gate(x) and up(x) only and recomputes
  the rest in backward (two elementwise passes, no extra matrix multiply).
* HF's RMSNorm keeps its input, the normalised input and (in the next Linear) the output.
  `_RMSNormFunction` keeps the input and one scalar per token.

Same formulas as HF's modules, so forward values are identical up to float rounding; the tests
compare outputs and every gradient with the unpatched model and count the bytes autograd keeps.
Applied per module instance (`make_lean`), only where it is exact: float32 CPU weights, a plain
`nn.Linear` MLP without bias and SiLU activation (Llama, Qwen2, Mistral style). Modules wrapped by
LoRA (peft) or anything else are left alone.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


class _SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down):
        g = F.linear(x, w_gate)
        u = F.linear(x, w_up)
        y = F.linear(F.silu(g).mul_(u), w_down)
        ctx.save_for_backward(x, g, u, w_gate, w_up, w_down)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, g, u, w_gate, w_up, w_down = ctx.saved_tensors
        sig = torch.sigmoid(g)
        silu = g * sig
        da = dy.matmul(w_down)  # d(silu(g) * u)
        d_wd = None
        if ctx.needs_input_grad[3]:
            d_wd = dy.reshape(-1, dy.shape[-1]).t().matmul((silu * u).reshape(-1, u.shape[-1]))
        du = da * silu
        # d silu(g)/dg = sig * (1 + g * (1 - sig))
        dg = da.mul_(u).mul_(sig.mul_(g.mul(1 - sig).add_(1)))
        dx = dg.matmul(w_gate).add_(du.matmul(w_up)) if ctx.needs_input_grad[0] else None
        x2 = x.reshape(-1, x.shape[-1])
        d_wg = dg.reshape(-1, dg.shape[-1]).t().matmul(x2) if ctx.needs_input_grad[1] else None
        d_wu = du.reshape(-1, du.shape[-1]).t().matmul(x2) if ctx.needs_input_grad[2] else None
        return dx, d_wg, d_wu, d_wd


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))
        ctx.save_for_backward(x, rstd, weight)
        return weight * (x * rstd)

    @staticmethod
    def backward(ctx, dy):
        x, rstd, weight = ctx.saved_tensors
        xhat = x * rstd
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy * xhat).reshape(-1, x.shape[-1]).sum(0)
        dxhat = dy * weight
        dx = None
        if ctx.needs_input_grad[0]:
            dx = (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True)).mul_(rstd)
        return dx, dw, None


def _lean_mlp_forward(self, x):
    if not torch.is_grad_enabled():
        return self._dense_forward(x)
    return _SwiGLUFunction.apply(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)


def _lean_norm_forward(self, x):
    if not torch.is_grad_enabled() or x.dtype != torch.float32:
        return self._dense_forward(x)
    return _RMSNormFunction.apply(x, self.weight, self._lean_eps)


# Classes whose forward is exactly down(silu(gate(x)) * up(x)) / weight * (x * rsqrt(mean(x^2) + eps)).
# (Gemma's RMSNorm scales by 1 + weight, so families are listed, not matched by name pattern.)
LEAN_MLPS = {"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP"}
LEAN_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"}


def _silu(act) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _plain_linear(m) -> bool:
    return type(m) is nn.Linear and m.bias is None and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"


def make_lean(model) -> dict[str, int]:
    """Patch every eligible MLP and RMSNorm of `model` in place; returns how many of each."""
    counts = {"mlp": 0, "norm": 0}
    for mod in model.modules():
        if "forward" in mod.__dict__:
            continue  # already patched (or patched by someone else)
        name = type(mod).__name__
        if name in LEAN_MLPS and all(_plain_linear(getattr(mod, p, None)) for p in ("gate_proj", "up_proj", "down_proj")):
            if _silu(getattr(mod, "act_fn", None)):
                mod._dense_forward = mod.forward
                mod.forward = types.MethodType(_lean_mlp_forward, mod)
                counts["mlp"] += 1
        elif name in LEAN_NORMS and isinstance(getattr(mod, "weight", None), nn.Parameter):
            eps = getattr(mod, "variance_epsilon", getattr(mod, "eps", None))
            w = mod.weight
            if eps is not None and w.dtype == torch.float32 and w.device.type == "cpu" and w.dim() == 1:
                mod._lean_eps = float(eps)
                mod._dense_forward = mod.forward
                mod.forward = types.MethodType(_lean_norm_forward, mod)
                counts["norm"] += 1
    return counts
