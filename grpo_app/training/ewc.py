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
produces lambda * F_i * (theta_i - theta*_i) directly. F is stored in bfloat16, the anchor in float32: in memory,
or (`offload`, the engine's default) only in the run folder's ewc.safetensors, read back one tensor at a time
whenever the penalty is computed. It is added to the GRPO loss. By default
(`ewc.clip_penalty: false`) its gradient is added after gradient clipping instead (`add_penalty_grad`):
the Fisher of a trained LM is dominated by LayerNorm gains (~10^4 x the mean), so inside the clipped
norm the penalty would set the clip factor and shrink every policy update with it.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from grpo_app.core import distributed
from grpo_app.core.fileio import atomic_open, atomic_write_json


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

    # Each parameter's gradient is squared into its Fisher entry as soon as backward produces it and
    # replaced by a zero that holds no memory, so the gradients of the whole model never exist at once
    # (~400 MB less at this pass's peak for SmolLM2-135M). A tensor hook sees a parameter's total
    # gradient (tied weights: both uses summed), exactly what torch.autograd.grad would return.
    def fold(name):
        def hook(g):
            fisher[name].add_(g.detach().float().pow(2))
            return g.new_zeros(()).expand(g.shape)

        return hook

    was_training = model.training
    model.eval()  # no dropout: the gradient of the model's log-likelihood itself
    for _, p in params:
        p.grad = None  # a training step's leftover gradients would sit in memory through the whole pass
    handles = [p.register_hook(fold(n)) for n, p in params]
    used = 0
    try:
        for i, (prompt, completion) in enumerate(samples):
            if should_stop is not None and should_stop():
                break
            with torch.enable_grad():
                lp = sequence_logprob(model, prompt, completion)
                torch.autograd.grad(lp, [p for _, p in params], allow_unused=True)
            del lp
            used += 1
            if progress is not None:
                progress(i + 1, len(samples))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if used == 0:
        raise InterruptedError("stopped before any Fisher sample")
    for f in fisher.values():
        f.div_(used)
    # Several training processes: one Fisher for every replica, the mean of their estimates (each on its
    # own samples), so that every replica applies the same penalty.
    distributed.average_(fisher)
    total = sum(f.sum().item() for f in fisher.values())
    count = sum(f.numel() for f in fisher.values())
    per_tensor = sorted(((n, f.mean().item()) for n, f in fisher.items()), key=lambda x: -x[1])
    stats = FisherStats(
        samples=used * distributed.world_size(),
        seconds=time.perf_counter() - t0,
        mean=total / max(count, 1),
        max=max(f.max().item() for f in fisher.values()),
        top=per_tensor[:5],
    )
    return fisher, stats


def _diff_and_fisher(p: torch.Tensor, anchor: Mapping, fisher: Mapping, name: str):
    """(theta - theta*) in float32 and F for one parameter, both on the parameter's device (the state may
    be read from a file, or live on another device)."""
    return p.detach().float() - anchor[name].to(p.device), fisher[name].to(p.device)


class _EWCPenaltyFn(torch.autograd.Function):
    """fisher / anchor: mappings name -> tensor, read one name at a time (they may live on disk)."""

    @staticmethod
    def forward(ctx, lam, fisher, anchor, names, *params):
        ctx.lam, ctx.fisher, ctx.anchor, ctx.names = lam, fisher, anchor, names
        ctx.save_for_backward(*params)
        total = torch.zeros((), dtype=torch.float64, device=params[0].device)
        for n, p in zip(names, params):
            d, f = _diff_and_fisher(p, anchor, fisher, n)
            total += torch.dot((d * f).flatten(), d.flatten()).double()
        return (0.5 * lam * total).to(params[0].dtype if params[0].is_floating_point() else torch.float32)

    @staticmethod
    def backward(ctx, grad_out):
        params = ctx.saved_tensors
        grads = []
        for n, p in zip(ctx.names, params):
            d, f = _diff_and_fisher(p, ctx.anchor, ctx.fisher, n)
            grads.append(d.mul_(f).mul_(grad_out * ctx.lam).to(p.dtype))
        return (None, None, None, None, *grads)


# safetensors dtype names, for the streaming writer and reader below (the files are plain safetensors).
_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def _bytes_of(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy())  # .cpu(): same memory on the CPU


class TensorFile(Mapping):
    """The tensors under one key prefix of a safetensors file, each read from disk when asked for.

    Every lookup reads that tensor's bytes into a new tensor with plain file reads: the file's pages
    sit in the OS file cache (shared, reclaimable), not in this process's memory, and the tensor is
    freed as soon as its user drops it. Membership and shapes come from the header, without reads.
    """

    def __init__(self, path: Path, prefix: str = ""):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        self._base = 8 + n
        self._meta = {k[len(prefix) :]: v for k, v in header.items() if k != "__metadata__" and k.startswith(prefix)}

    def spec(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        m = self._meta[name]
        return tuple(m["shape"]), _ST_DTYPES[m["dtype"]]

    def __getitem__(self, name: str) -> torch.Tensor:
        shape, dtype = self.spec(name)
        start, end = self._meta[name]["data_offsets"]
        t = torch.empty(shape, dtype=dtype)
        buf = _bytes_of(t)
        if len(buf) != end - start:
            raise ValueError(f"{self.path}: tensor {name!r} has {end - start} bytes, its shape needs {len(buf)}")
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self._base + start)
            got = 0
            while got < len(buf):
                k = f.readinto(buf[got:])
                if not k:
                    raise ValueError(f"{self.path} is truncated (tensor {name!r}); the EWC state must be recomputed")
                got += k
        return t

    def __contains__(self, name) -> bool:
        return name in self._meta

    def __iter__(self) -> Iterator[str]:
        return iter(self._meta)

    def __len__(self) -> int:
        return len(self._meta)


def _spec(tensors: Mapping, name: str) -> tuple[tuple[int, ...], torch.dtype]:
    if isinstance(tensors, TensorFile):
        return tensors.spec(name)
    t = tensors[name]
    return tuple(t.shape), t.dtype


def write_tensors(path: Path, entries: list[tuple[str, tuple[int, ...], torch.dtype, Callable[[], torch.Tensor]]]) -> None:
    """Write a safetensors file one tensor at a time: `entries` are (key, shape, dtype, make), and each
    `make()` is called, written and dropped in turn, so the whole set is never in memory at once.
    Written to a temporary name and renamed, so a reader never sees half a file."""
    path = Path(path)
    header, offset = {}, 0
    for key, shape, dtype, _ in entries:
        nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        header[key] = {"dtype": _ST_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
    with atomic_open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for key, shape, dtype, make in entries:
            t = make()
            if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
                raise ValueError(f"{key}: expected {tuple(shape)} {dtype}, got {tuple(t.shape)} {t.dtype}")
            f.write(_bytes_of(t))
            del t


# The Fisher is a weight per parameter: bfloat16's 8 significant bits (<= 0.4% relative rounding) are plenty,
# and halve its memory (~210 MB for SmolLM2-135M). The anchor stays float32: theta - theta* is tiny next to
# theta, so a rounded anchor would be mostly rounding error.
FISHER_DTYPE = torch.bfloat16


class EWCState:
    """Consolidated Fisher (bfloat16) + anchor weights (float32), keyed by parameter name.

    With `offload`, both live only in a folder's ewc.safetensors once consolidated there
    (`consolidate(..., folder=...)` or `load(..., offload=True)`), and are read back one tensor at a time:
    ~640 MB less resident memory for SmolLM2-135M, for two reads of that file per optimizer step.
    """

    def __init__(self, lam: float, gamma: float = 1.0, normalize: bool = True, offload: bool = False):
        self.lam = float(lam)
        self.gamma = float(gamma)
        self.normalize = normalize
        self.offload = offload
        self.fisher: Mapping[str, torch.Tensor] = {}
        self.anchor: Mapping[str, torch.Tensor] = {}
        self.folder: Path | None = None  # the folder whose ewc.safetensors holds fisher/anchor, when on disk
        self.stages: list[dict] = []  # one entry per consolidated stage (name, samples, stats)

    @property
    def active(self) -> bool:
        return bool(self.fisher) and self.lam > 0

    def consolidate(
        self, model, new_fisher: dict[str, torch.Tensor], info: dict | None = None, folder: Path | None = None
    ) -> None:
        """F <- gamma * F + F_new (each stage's F_new divided by its mean with `normalize`), theta* <- theta.
        With `folder`, the state is also saved there; with `offload` as well, it is kept only there (written
        tensor by tensor, never whole in memory)."""
        scale = 1.0
        if self.normalize:
            total = sum(f.sum().item() for f in new_fisher.values())
            count = sum(f.numel() for f in new_fisher.values())
            mean = total / max(count, 1)
            scale = 1.0 / mean if mean > 0 else 1.0
        old = self.fisher
        names = list(old) + [n for n in new_fisher if n not in old]

        def fisher_of(name: str) -> torch.Tensor:
            f = new_fisher[name].float() * scale if name in new_fisher else None
            if name in old:
                prev = old[name].to(f.device if f is not None else None, torch.float32, copy=True)
                f = prev if f is None else prev.mul_(self.gamma).add_(f)
            return f.to(FISHER_DTYPE)

        params = dict(trainable_parameters(model))
        anchored = [n for n in names if n in params]
        self.stages.append({**(info or {}), "scale": scale})
        if self.offload and folder is not None:
            folder = Path(folder)
            folder.mkdir(parents=True, exist_ok=True)
            entries = [
                (f"fisher::{n}", new_fisher[n].shape if n in new_fisher else _spec(old, n)[0], FISHER_DTYPE,
                 lambda n=n: fisher_of(n))
                for n in names
            ]
            entries += [
                (f"anchor::{n}", tuple(params[n].shape), torch.float32, lambda n=n: params[n].detach().float())
                for n in anchored
            ]
            write_tensors(folder / "ewc.safetensors", entries)
            self._write_meta(folder)
            self._attach(folder)
            return
        self.fisher = {n: fisher_of(n) for n in names}
        self.anchor = {n: params[n].detach().float().clone() for n in anchored}
        self.folder = None
        if folder is not None:
            self.save(folder)

    def _attach(self, folder: Path) -> None:
        self.folder = Path(folder)
        path = self.folder / "ewc.safetensors"
        self.fisher = TensorFile(path, "fisher::")
        self.anchor = TensorFile(path, "anchor::")

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
        return _EWCPenaltyFn.apply(self.lam, self.fisher, self.anchor, names, *[params[n] for n in names])

    @torch.no_grad()
    def add_penalty_grad(self, model) -> None:
        """p.grad += lambda * F * (theta - theta*): the penalty's exact gradient, added in place (used after
        gradient clipping, so the clip factor is set by the GRPO gradient alone)."""
        names, params = self._aligned(model)
        for n in names:
            p = params[n]
            d, f = _diff_and_fisher(p, self.anchor, self.fisher, n)
            g = d.mul_(f).mul_(self.lam).to(p.dtype)
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)

    def penalty_value(self, model) -> float:
        with torch.no_grad():
            return float(self.penalty(model))

    # ---- persistence --------------------------------------------------------------------------
    def _write_meta(self, folder: Path) -> None:
        meta = {"lam": self.lam, "gamma": self.gamma, "normalize": self.normalize, "stages": self.stages}
        atomic_write_json(Path(folder) / "ewc.json", meta)

    def save(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        same = self.folder is not None and self.folder.resolve() == folder.resolve()
        if not same:  # (a state kept in this folder's file is already there)
            entries = [(f"fisher::{n}", *_spec(self.fisher, n), lambda n=n: self.fisher[n]) for n in self.fisher]
            entries += [(f"anchor::{n}", *_spec(self.anchor, n), lambda n=n: self.anchor[n]) for n in self.anchor]
            write_tensors(folder / "ewc.safetensors", entries)
        self._write_meta(folder)

    @classmethod
    def load(cls, folder: Path, lam: float | None = None, offload: bool = False, device=None) -> EWCState:
        """The state saved in `folder`; with `offload`, read from its file when used instead of loaded now,
        else loaded onto `device` (default: the CPU)."""
        folder = Path(folder)
        meta = json.loads((folder / "ewc.json").read_text())
        st = cls(lam if lam is not None else meta["lam"], meta["gamma"], meta["normalize"], offload=offload)
        st.stages = meta.get("stages", [])
        st._attach(folder)
        if not offload:
            st.fisher = {n: t.to(device, FISHER_DTYPE) for n, t in st.fisher.items()}
            st.anchor = {n: t.to(device, torch.float32) for n, t in st.anchor.items()}
            st.folder = None
        return st
