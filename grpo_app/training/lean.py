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

`layer_hooks` goes further (gradient checkpointing, `grpo.gradient_checkpointing`): each decoder
layer keeps only its input, and its activations are recomputed by running the layer again during
backward (torch's non-reentrant checkpoint; same kernels, so the same numbers). Unlike HF's
checkpointing, which drops a KV cache while training, it keeps the trainer's shared prompt prefix: a
cache whose layers are replay-safe (`update` returns the same thing when the layer runs a second
time, see `trainer.PromptRecordLayer`/`PrefixLayer`) is passed through; any other cache is dropped,
as HF does. A recomputed layer's lean MLP runs its down projection outside its own function
(`_GateUpFunction`), so the recompute stops before that product, as it does for HF's MLP: a quarter of
the MLP's recompute (measured: the forward+backward of 8 GSM8K-length completions 5% faster).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from grpo_app.core.models import decoder_layers
from grpo_app.training.optim import trim_heap


def _gate_up_backward(needs, x, g, u, w_gate, w_up, da):
    """Gradients of silu(g) * u, g = gate(x), u = up(x), given `da`, the gradient of that product:
    (dx, d_w_gate, d_w_up), each None where `needs` says it is not needed."""
    sig = torch.sigmoid(g)
    du = da * (g * sig)
    # d silu(g)/dg = sig * (1 + g * (1 - sig))
    dg = (da * u).mul_(sig.mul_(g.mul(1 - sig).add_(1)))
    dx = dg.matmul(w_gate).add_(du.matmul(w_up)) if needs[0] else None
    x2 = x.reshape(-1, x.shape[-1])
    d_wg = dg.reshape(-1, dg.shape[-1]).t().matmul(x2) if needs[1] else None
    d_wu = du.reshape(-1, du.shape[-1]).t().matmul(x2) if needs[2] else None
    return dx, d_wg, d_wu


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
        d_wd = None
        if ctx.needs_input_grad[3]:
            a = F.silu(g).mul_(u)  # the forward's silu(g) * u, recomputed the same way
            d_wd = dy.reshape(-1, dy.shape[-1]).t().matmul(a.reshape(-1, a.shape[-1]))
        da = dy.matmul(w_down)  # d(silu(g) * u)
        return (*_gate_up_backward(ctx.needs_input_grad, x, g, u, w_gate, w_up, da), d_wd)


class _GateUpFunction(torch.autograd.Function):
    """silu(gate(x)) * up(x), keeping gate(x) and up(x): the lean MLP under layer recompute, where the down
    projection runs outside (`F.linear`, which autograd records). torch's checkpoint stops a layer's recompute
    as soon as the last tensor its backward needs is saved again, and `F.linear` saves its input before it
    multiplies, so the recompute ends before the down projection: a quarter of the MLP's recompute FLOPs (one
    of its three matrix multiplies) is not done twice. A function that multiplies by `down` inside, like
    `_SwiGLUFunction`, saves its tensors only when it returns, after that product. Without recompute the split
    would keep silu(g) * u as well (the down projection's input), so `_SwiGLUFunction` is used there."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up):
        g = F.linear(x, w_gate)
        u = F.linear(x, w_up)
        ctx.save_for_backward(x, g, u, w_gate, w_up)
        return F.silu(g).mul_(u)

    @staticmethod
    def backward(ctx, da):
        return _gate_up_backward(ctx.needs_input_grad, *ctx.saved_tensors, da)


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
    if self._grpo_split_down:  # set by layer_hooks when the layer is recomputed (see _GateUpFunction)
        return F.linear(_GateUpFunction.apply(x, self.gate_proj.weight, self.up_proj.weight), self.down_proj.weight)
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
                mod._grpo_split_down = getattr(mod, "_grpo_split_down", False)
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


def _trim_hook(grad):
    trim_heap()


def _records_graph(layer, args, kwargs) -> bool:
    """Whether autograd will record this layer's forward: its input needs a gradient or one of its own
    weights does. A frozen layer below the lowest trained one (model.trainable_layers) records nothing, so
    it needs neither a recompute nor a trim hook."""
    hidden = args[0] if args else kwargs.get("hidden_states")
    if torch.is_tensor(hidden) and hidden.requires_grad:
        return True
    return any(p.requires_grad for p in layer.parameters())


def _layer_forward(self, *args, **kwargs):
    if not (torch.is_grad_enabled() and self.training and _records_graph(self, args, kwargs)):
        return type(self).forward(self, *args, **kwargs)
    if self._grpo_recompute:
        cache = kwargs.get("past_key_values")
        if cache is not None:
            idx = getattr(getattr(self, "self_attn", None), "layer_idx", None)
            layers = getattr(cache, "layers", ())
            if idx is None or idx >= len(layers) or not getattr(layers[idx], "replay_safe", False):
                # A growing cache would get this layer's keys appended a second time in the recompute.
                kwargs["past_key_values"] = None
        out = checkpoint(type(self).forward, self, *args, use_reentrant=False, **kwargs)
    else:
        out = type(self).forward(self, *args, **kwargs)
    if self._grpo_trim:
        hidden = out[0] if isinstance(out, tuple) else out
        if torch.is_tensor(hidden) and hidden.requires_grad:
            hidden.register_hook(_trim_hook)  # runs as backward reaches this layer
    return out


# Backward frees each layer's temporaries, and the heap keeps much of it (glibc reuses freed blocks
# poorly when long-lived gradients land between them): ~0.5 GB of resident memory nobody uses by the end
# of a SmolLM2 backward. Trimming the heap when backward reaches every 10th layer returns it for ~2% of
# the backward's time (measured: trimming at every layer costs ~15%, the pages come back as page faults).
# The top layer trims too: backward reaches it first, while the forward's freed temporaries (each layer's,
# recompute keeps only its input) still sit in the heap: 16 completions of 128 tokens, peak 870 -> 680 MB
# above the weights; 8 of GSM8K lengths, 367 -> 317 MB; time within noise. Trimming in the forward as well
# (before layers 0, 10, 20) cut the latter to ~190 MB but cost 2% of the forward+backward: not done.
TRIM_EVERY = 10


def layer_hooks(model, recompute: bool = False, trim_every: int = TRIM_EVERY) -> int:
    """Patch the decoder layers of `model` (in training with gradients on): `recompute` checkpoints each
    layer (and a lean MLP then runs its down projection outside, see _GateUpFunction); `trim_every` > 0 hands
    freed heap back to the OS when backward reaches every such layer (layer index divisible by it) and the
    top one. Returns how many layers were patched."""
    n = 0
    layers = decoder_layers(model)
    for mod in layers:
        if "forward" not in mod.__dict__:
            idx = getattr(mod.self_attn, "layer_idx", None)
            mod._grpo_recompute = bool(recompute)
            if getattr(mod, "mlp", None) is not None:  # read by a lean MLP, made before or after this
                mod.mlp._grpo_split_down = bool(recompute)
            mod._grpo_trim = bool(trim_every) and idx is not None and (idx % trim_every == 0 or mod is layers[-1])
            if mod._grpo_recompute or mod._grpo_trim:
                mod.forward = types.MethodType(_layer_forward, mod)
                n += 1
    return n
