"""Diagonal Fisher information and the EWC penalty, on plain tensors.

Fisher (Kirkpatrick et al. 2017): F_i = E[(d/dtheta_i log p(y | x))^2], estimated as the mean over
`n` samples of the *per-sample* squared gradient of the sequence log-likelihood (sum over the
completion tokens). Each sample gets its own backward pass: the square of a batch-mean gradient
would be a different (and much smaller) quantity.

Which samples: `sampled` uses completions the policy itself generated on the stage's prompts (the
last ones it sampled during training, so no extra generation); `reference` uses the problems'
worked solutions (the "empirical Fisher" of the data).

Consolidation across stages is online EWC (Schwarz et al. 2018): after stage k,
F <- gamma * F + F_k and theta* <- theta at the end of stage k. With gamma = 1 this is the running
sum of every earlier stage's Fisher, anchored at the latest weights. With `normalize`, each F_k is
divided by its mean first, so lambda keeps its meaning across model sizes.

The penalty lambda/2 * sum_i F_i (theta_i - theta*_i)^2 is a custom autograd function: forward
reduces parameter by parameter without keeping the (theta - theta*) tensors alive, and backward
produces lambda * F_i * (theta_i - theta*_i) directly. F is stored in bfloat16, the anchor in float32. It is added to the GRPO loss. By default
(`ewc.clip_penalty: false`) its gradient is added after gradient clipping instead (`add_penalty_grad`):
the Fisher of a trained LM is dominated by LayerNorm gains (~10^4 x the mean), so inside the clipped
norm the penalty would set the clip factor and shrink every policy update with it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


def trainable_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    seen, out = set(), []
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def sequence_logprob(model, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> torch.Tensor:
    """log p(completion | prompt) summed over completion tokens (differentiable)."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=next(model.parameters()).device)
    out = model(input_ids=ids)
    logits = out.logits if hasattr(out, "logits") else out
    n = len(completion_ids)
    pred = logits[0, -n - 1 : -1].float()  # positions that predict each completion token
    target = ids[0, -n:]
    return F.log_softmax(pred, dim=-1).gather(-1, target.unsqueeze(-1)).sum()


@dataclass
class FisherStats:
    samples: int
    seconds: float
    mean: float
    max: float
    top: list[tuple[str, float]]  # parameter tensors with the largest mean Fisher


def compute_fisher(
    model,
    samples: Sequence[tuple[Sequence[int], Sequence[int]]],
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[dict[str, torch.Tensor], FisherStats]:
    """Diagonal empirical Fisher over the trainable parameters: mean of squared per-sample gradients."""
    t0 = time.perf_counter()
    samples = [(list(p), list(c)) for p, c in samples if len(c) > 0]
    if not samples:
        raise ValueError("the Fisher needs at least one sample with a non-empty completion")
    params = trainable_parameters(model)
    if not params:
        raise ValueError("the model has no trainable parameters")
    fisher = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params}
    was_training = model.training
    model.eval()  # no dropout: the gradient of the model's log-likelihood itself
    used = 0
    try:
        for i, (prompt, completion) in enumerate(samples):
            if should_stop is not None and should_stop():
                break
            for _, p in params:
                p.grad = None
            with torch.enable_grad():
                lp = sequence_logprob(model, prompt, completion)
                grads = torch.autograd.grad(lp, [p for _, p in params], allow_unused=True)
            for (n, _), g in zip(params, grads):
                if g is not None:
                    fisher[n].add_(g.detach().float().pow(2))
            used += 1
            if progress is not None:
                progress(i + 1, len(samples))
    finally:
        model.train(was_training)
    if used == 0:
        raise InterruptedError("stopped before any Fisher sample")
    for f in fisher.values():
        f.div_(used)
    total = sum(f.sum().item() for f in fisher.values())
    count = sum(f.numel() for f in fisher.values())
    per_tensor = sorted(((n, f.mean().item()) for n, f in fisher.items()), key=lambda x: -x[1])
    stats = FisherStats(
        samples=used,
        seconds=time.perf_counter() - t0,
        mean=total / max(count, 1),
        max=max(f.max().item() for f in fisher.values()),
        top=per_tensor[:5],
    )
    return fisher, stats


class _EWCPenaltyFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lam, fisher, anchor, *params):
        ctx.lam, ctx.fisher, ctx.anchor = lam, fisher, anchor
        ctx.save_for_backward(*params)
        total = torch.zeros((), dtype=torch.float64, device=params[0].device)
        for p, f, a in zip(params, fisher, anchor):
            d = p.detach().float() - a
            total += torch.dot((d * f).flatten(), d.flatten()).double()
        return (0.5 * lam * total).to(params[0].dtype if params[0].is_floating_point() else torch.float32)

    @staticmethod
    def backward(ctx, grad_out):
        params = ctx.saved_tensors
        grads = []
        for p, f, a in zip(params, ctx.fisher, ctx.anchor):
            grads.append((p.detach().float() - a).mul_(f).mul_(grad_out * ctx.lam).to(p.dtype))
        return (None, None, None, *grads)


# The Fisher is a weight per parameter: bfloat16's 8 significant bits (<= 0.4% relative rounding) are plenty,
# and halve its memory (~210 MB for SmolLM2-135M). The anchor stays float32: theta - theta* is tiny next to
# theta, so a rounded anchor would be mostly rounding error.
FISHER_DTYPE = torch.bfloat16


class EWCState:
    """Consolidated Fisher (bfloat16) + anchor weights (float32), keyed by parameter name."""

    def __init__(self, lam: float, gamma: float = 1.0, normalize: bool = True):
        self.lam = float(lam)
        self.gamma = float(gamma)
        self.normalize = normalize
        self.fisher: dict[str, torch.Tensor] = {}
        self.anchor: dict[str, torch.Tensor] = {}
        self.stages: list[dict] = []  # one entry per consolidated stage (name, samples, stats)

    @property
    def active(self) -> bool:
        return bool(self.fisher) and self.lam > 0

    def consolidate(self, model, new_fisher: dict[str, torch.Tensor], info: dict | None = None) -> None:
        scale = 1.0
        if self.normalize:
            total = sum(f.sum().item() for f in new_fisher.values())
            count = sum(f.numel() for f in new_fisher.values())
            mean = total / max(count, 1)
            scale = 1.0 / mean if mean > 0 else 1.0
        for name, f in new_fisher.items():
            f = f.float() * scale
            if name in self.fisher:
                f = self.fisher[name].float().mul_(self.gamma).add_(f)
            self.fisher[name] = f.to(FISHER_DTYPE)
        params = dict(trainable_parameters(model))
        self.anchor = {n: params[n].detach().float().clone() for n in self.fisher if n in params}
        self.stages.append({**(info or {}), "scale": scale})

    def _aligned(self, model):
        params = dict(trainable_parameters(model))
        names = [n for n in self.fisher if n in params and n in self.anchor]
        if not names:
            raise RuntimeError(
                "EWC state does not match the model's trainable parameters (different model or LoRA setting?)"
            )
        return names, params

    def penalty(self, model) -> torch.Tensor:
        """lambda/2 * sum_i F_i (theta_i - theta*_i)^2, differentiable w.r.t. the model's parameters."""
        names, params = self._aligned(model)
        return _EWCPenaltyFn.apply(
            self.lam,
            [self.fisher[n] for n in names],
            [self.anchor[n] for n in names],
            *[params[n] for n in names],
        )

    @torch.no_grad()
    def add_penalty_grad(self, model) -> None:
        """p.grad += lambda * F * (theta - theta*): the penalty's exact gradient, added in place (used after
        gradient clipping, so the clip factor is set by the GRPO gradient alone)."""
        names, params = self._aligned(model)
        for n in names:
            p = params[n]
            g = (p.detach().float() - self.anchor[n]).mul_(self.fisher[n]).mul_(self.lam).to(p.dtype)
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)

    def penalty_value(self, model) -> float:
        with torch.no_grad():
            return float(self.penalty(model))

    # ---- persistence --------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {f"fisher::{n}": t.contiguous() for n, t in self.fisher.items()}
        tensors.update({f"anchor::{n}": t.contiguous() for n, t in self.anchor.items()})
        tmp = folder / "ewc.safetensors.tmp"
        save_file(tensors, str(tmp))
        tmp.replace(folder / "ewc.safetensors")
        meta = {"lam": self.lam, "gamma": self.gamma, "normalize": self.normalize, "stages": self.stages}
        tmpj = folder / "ewc.json.tmp"
        tmpj.write_text(json.dumps(meta, indent=2))
        tmpj.replace(folder / "ewc.json")

    @classmethod
    def load(cls, folder: Path, lam: float | None = None) -> EWCState:
        from safetensors.torch import load_file

        folder = Path(folder)
        meta = json.loads((folder / "ewc.json").read_text())
        st = cls(lam if lam is not None else meta["lam"], meta["gamma"], meta["normalize"])
        tensors = load_file(str(folder / "ewc.safetensors"))
        for key, t in tensors.items():
            kind, name = key.split("::", 1)
            if kind == "fisher":
                st.fisher[name] = t.to(FISHER_DTYPE)
            else:
                st.anchor[name] = t.float()
        st.stages = meta.get("stages", [])
        return st
