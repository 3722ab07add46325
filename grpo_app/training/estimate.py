"""Before Start: one training step's peak memory and time, estimated from the settings and this machine.

Settings that each pass their own limits can combine into a step no machine here finishes (G x prompts x
completion length x a long budget): `check_step` refuses those before anything starts, with the estimate
in the message. What is measured, read, assumed and calibrated:

* measured here, once per process: the available memory (psutil) and the fp32 matrix-multiply rate of
  this machine on the threads torch uses (a 512 x 2048 x 2048 product for ~0.25 s: the `gemm.gflops_peak`
  of bench/step_speed.py). On a GPU: its free memory; the time is not estimated there.
* read: the model's shape, from the config.json of the embedded or a local model, or from the table of the
  presets' hub models below. A model whose shape cannot be read offline is not estimated (nothing refused).
* assumed: every completion runs to its token budget (an untrained model's often do, and the first step is
  the one that must not run for tens of minutes); a prompt of the system prompt plus a question
  (`prompt_tokens`); every row sampled to the end (finished rows leave the batch in reality, which only
  makes the step shorter).
* calibrated against this project's measurements of SmolLM2-135M on 2 cores:
  - sampling runs at a fraction of the matmul rate that grows with the batch: `GEN_UTIL`, the
    `fraction_of_matmul_limit` of assets/step_speed.json (generation.batch16..batch256, against its
    gflops_peak 300);
  - the training pass (forward + backward, + recompute) runs at `TRAIN_UTIL` = 0.61 of it:
    assets/step_speed.json `engine`: 65.73 s/step x (1 - generation_share 0.313) = 45.2 s for
    8 x 134.5 M parameters x (64 x 94.6 completion + 16 x ~104 prompt tokens) = 8.2 TFLOP -> 182 GFLOP/s;
  - the bytes autograd keeps per token and layer: `ACT_FACTOR` x the layer's activation widths, from
    assets/memory.json (quick preset, layer recompute off minus on: 3117 - 2250 MB for 8 x 96 + ~60 tokens
    per micro-batch over 30 layers -> ~38 KB per token and layer);
  - what the process holds besides the model and the step (torch, libraries, allocator slack):
    `RUNTIME_BYTES`, the quick preset's measured peak (2250 MB, memory.json `variants.preset`) minus this
    model's estimate of it.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field

from grpo_app.core.config import Config, ConfigError

MB = 2**20
GEN_UTIL = ((16, 0.177), (32, 0.259), (64, 0.33), (128, 0.38), (256, 0.413))  # rows -> fraction (see above)
TRAIN_UTIL = 0.61
ACT_FACTOR = 1.39  # measured bytes kept per token and layer / 4 x (4d + 2I + 2 q/o + 2 k/v widths), SmolLM2
RUNTIME_BYTES = 643 * MB  # 2250 MB measured - 1607 MB estimated for the rest (quick preset)
LOGPROB_CHUNK = 512  # vocabulary columns per LM-head tile in the training pass (trainer.py uses this one)
LOGPROB_TILE_ROWS = 4096  # positions per LM-head tile (TRL 1.16's TOKEN_CHUNK_SIZE)
KEPT_LOGITS_BYTES = 256 * MB  # a micro-batch's LM-head logits kept for backward, at most (trainer departure 3)

# Shapes of the hub models the presets name (their config.json), for machines that have not downloaded them.
KNOWN_SHAPES = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
}


def max_step_minutes() -> float:
    """The longest first step a server starts (GRPO_APP_MAX_STEP_MINUTES, default 15; 0 = no limit)."""
    try:
        return max(0.0, float(os.environ.get("GRPO_APP_MAX_STEP_MINUTES", "15")))
    except ValueError:
        return 15.0


# ------------------------------------------------------------------------------------------------
# The machine and the model
# ------------------------------------------------------------------------------------------------
@dataclass
class Machine:
    available_bytes: int  # memory this job may still take (CPU RAM, or the GPU's free memory)
    gflops: float | None  # fp32 matmul rate (None on a GPU: time not estimated)
    device: str = "cpu"


_GFLOPS: dict[int, float] = {}
_GFLOPS_LOCK = threading.Lock()


def measured_gflops(again: bool = False) -> float:
    """fp32 matmul rate on the threads torch uses now: the best of five ~50 ms trials, measured once per
    process and thread count (`again`: measure once more and keep the better figure; a machine busy with
    other work at that moment measures lower)."""
    import torch

    threads = torch.get_num_threads()
    with _GFLOPS_LOCK:
        if again or threads not in _GFLOPS:
            a, b = torch.randn(512, 2048), torch.randn(2048, 2048)
            a @ b  # the thread pool's start
            best = 0.0
            for _ in range(5):
                n, t0 = 0, time.perf_counter()
                while n < 1 or time.perf_counter() - t0 < 0.05:
                    a @ b
                    n += 1
                best = max(best, 2 * 512 * 2048 * 2048 * n / (time.perf_counter() - t0) / 1e9)
            _GFLOPS[threads] = max(best, _GFLOPS.get(threads, 0.0))
        return _GFLOPS[threads]


def this_machine(cfg: Config) -> Machine:
    import psutil

    from grpo_app.core.models import pick_device

    device = pick_device(cfg.model.device)
    if device == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        return Machine(available_bytes=int(free), gflops=None, device="cuda")
    # this process's own resident memory counts as reusable: it already holds torch and the libraries
    rss = psutil.Process().memory_info().rss
    return Machine(available_bytes=int(psutil.virtual_memory().available + rss), gflops=measured_gflops())


def model_shape(name: str) -> dict | None:
    """The model's dimensions, read without loading it (None when they cannot be read offline)."""
    import json
    from pathlib import Path

    if name in KNOWN_SHAPES:
        return dict(KNOWN_SHAPES[name])
    from grpo_app.core.models import ModelError, cache_root, resolve_model, tiny_config

    if name == "tiny-random":  # the tiny test model's own config (with the embedded tokenizer's vocabulary)
        tiny = tiny_config(49152)
        keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings")
        return {k: getattr(tiny, k) for k in keys}

    try:
        if name == "embedded":
            path = cache_root() / "smollm2-135m-instruct-f32" / "config.json"  # (never built here: too slow)
            if not path.is_file():
                return dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                            num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)
        else:
            spec = resolve_model(name)
            if spec.kind != "local":
                return None
            path = Path(spec.ref) / "config.json"
        raw = json.loads(path.read_text())
    except (ModelError, OSError, ValueError):
        return None
    raw = raw.get("text_config", raw)
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    if not all(isinstance(raw.get(k), int) and raw[k] > 0 for k in keys):
        return None
    shape = {k: raw[k] for k in keys}
    shape["num_key_value_heads"] = raw.get("num_key_value_heads") or raw["num_attention_heads"]
    shape["tie_word_embeddings"] = bool(raw.get("tie_word_embeddings", True))
    shape["head_dim"] = raw.get("head_dim")
    return shape


# ------------------------------------------------------------------------------------------------
# The estimate
# ------------------------------------------------------------------------------------------------
@dataclass
class StepEstimate:
    peak_bytes: int
    memory_parts: dict  # name -> bytes (of the phase with the highest peak)
    peak_phase: str  # "sampling" or "training pass"
    seconds: float | None  # one step, worst case (every completion to its budget)
    sampling_seconds: float | None
    training_seconds: float | None
    micro_batch_seconds: float | None  # the longest stretch a stop cannot cut (one micro-batch fwd+bwd)
    machine: Machine
    notes: list = field(default_factory=list)

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v / MB:,.0f} MB" for k, v in self.memory_parts.items())
        text = f"peak memory ~{self.peak_bytes / MB:,.0f} MB in the {self.peak_phase} ({parts})"
        if self.seconds is not None:
            text += (
                f"; one step ~{_minutes(self.seconds)} (sampling ~{_minutes(self.sampling_seconds)}, training pass "
                f"~{_minutes(self.training_seconds)}) if every completion runs to its budget, at the "
                f"{self.machine.gflops:,.0f} GFLOP/s measured on this machine"
            )
        return text


def _minutes(s: float | None) -> str:
    if s is None:
        return "?"
    return f"{s / 60:,.1f} min" if s >= 90 else f"{s:,.0f} s"


def prompt_tokens(cfg: Config) -> int:
    """Assumed prompt length: the system prompt and the training hint (~3.5 characters a token)
    + chat template + a question (GSM8K ~80 tokens, generated problems ~30)."""
    gsm = any(s.source in ("gsm8k", "gsm_symbolic", "custom") for s in cfg.stages)
    return math.ceil((len(cfg.data.system_prompt) + len(cfg.data.training_hint)) / 3.5) + 12 + (80 if gsm else 30)


def _gen_util(rows: int) -> float:
    pts = GEN_UTIL
    if rows <= pts[0][0]:
        return pts[0][1] * rows / pts[0][0]  # below 16 rows a decode step costs about the same as at 16
    for (r0, u0), (r1, u1) in zip(pts, pts[1:]):
        if rows <= r1:
            return u0 + (u1 - u0) * math.log(rows / r0) / math.log(r1 / r0)
    return pts[-1][1]


def estimate_step(cfg: Config, machine: Machine | None = None) -> StepEstimate | None:
    """The peak memory and the time of one step of `cfg` on `machine` (this one by default); None when the
    model's shape cannot be read offline."""
    shape = model_shape(cfg.model.name)
    if shape is None:
        return None
    machine = machine or this_machine(cfg)
    g = cfg.grpo
    d, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv, vocab = shape["num_attention_heads"], shape["num_key_value_heads"], shape["vocab_size"]
    hd = shape.get("head_dim") or d // heads
    embed = vocab * d
    per_layer = d * heads * hd * 2 + d * kv * hd * 2 + 3 * d * inter + 2 * d
    params = embed + layers * per_layer + d + (0 if shape["tie_word_embeddings"] else embed)
    trained_layers = min(cfg.model.trainable_layers, layers) or layers  # the top ones; those below are frozen
    frozen_params = (layers - trained_layers) * per_layer
    if cfg.model.lora:
        trainable = trained_layers * 7 * cfg.model.lora_r * (d + max(d, inter))  # adapters on every projection, at most
    else:
        trainable = params - (0 if cfg.model.train_embeddings else embed) - frozen_params
    rows, unique, plen, length = g.generation_batch, g.prompts_per_step, prompt_tokens(cfg), \
        g.max_completion_length
    micro = cfg.micro_batch
    f32 = 4

    # ---- memory: the sampling phase and the training pass, each on top of what the step always holds
    held = {
        "weights": params * f32,
        "gradients": trainable * f32,
        "optimizer": trainable * (4 if g.optimizer == "adamw_bf16_moments" else 8),
        "runtime": RUNTIME_BYTES,
    }
    if cfg.ewc.enabled and len(cfg.stages) > 1 and not (cfg.ewc.offload and machine.device == "cpu"):
        held["EWC anchor + Fisher"] = 2 * trainable * f32
    kl = any(cfg.stage_has_kl(k) for k in range(len(cfg.stages)))  # (the worst stage)
    if kl and not cfg.model.lora:
        held["KL reference model"] = params * f32  # a frozen copy of the policy (trainer.py, departure 9)
    kv_per_token = layers * 2 * kv * hd * f32
    sampling = {
        "KV cache": (rows * length + unique * plen) * kv_per_token,
        "logits": rows * vocab * f32 * 3,  # logits, probabilities, the sampler's working copy
    }
    if g.packed_sampling and g.fast_generation and machine.device == "cpu":
        sampling["packed weights"] = params * f32  # a oneDNN-packed copy of every weight (sampler.packed_linears)
    act = ACT_FACTOR * f32 * (4 * d + 2 * inter + 2 * heads * hd + 2 * kv * hd)  # per token and layer
    mb_tokens = micro * length + max(1, micro // g.num_generations) * plen
    # recompute: one layer's activations at a time; frozen layers below the trained ones keep none
    kept_layers = 1 if g.gradient_checkpointing else trained_layers
    kept_logits = micro * length * vocab * f32  # (without Triton, up to the budget: lm_head)
    training = {
        "activations": mb_tokens * (kept_layers * act + (trained_layers * d * f32 if g.gradient_checkpointing else 0)),
        "LM-head tile": min(LOGPROB_TILE_ROWS, micro * length) * min(LOGPROB_CHUNK, vocab) * f32 * 2,
        "LM-head logits kept": min(kept_logits, KEPT_LOGITS_BYTES) if machine.device not in ("cuda", "xpu") else 0,
    }
    phase, extra = max((("sampling", sampling), ("training pass", training)), key=lambda x: sum(x[1].values()))
    parts = {**held, **extra}
    peak = int(sum(parts.values()))

    # ---- time
    sampling_s = training_s = micro_s = total_s = None
    notes = []
    if machine.gflops:
        rate = machine.gflops * 1e9
        flops_tok = 2 * (params - (0 if shape["tie_word_embeddings"] else embed))  # every matmul weight (LM head too)
        attn_tok = 4 * layers * heads * hd  # per token of context
        gen_flops = rows * length * (flops_tok + attn_tok * (plen + length / 2)) + unique * plen * flops_tok
        sampling_s = gen_flops / (rate * _gen_util(rows))
        passes = 8 if g.gradient_checkpointing else 6  # FLOPs per parameter and token: forward 2, backward 4,
        # recompute 2. (Completions whose advantage is 0 are skipped in reality: not counted on, worst case.)
        if kl:
            passes += 2  # the reference model's forward
        train_tokens = rows * length + unique * plen
        # frozen layers run their forward only (2 FLOPs per parameter and token)
        training_s = (passes * (flops_tok / 2 - frozen_params) + 2 * frozen_params) * train_tokens / (rate * TRAIN_UTIL)
        micro_s = training_s * mb_tokens / max(train_tokens, 1)
        total_s = sampling_s + training_s
    else:
        notes.append("time not estimated on a GPU")
    return StepEstimate(peak, parts, phase, total_s, sampling_s, training_s, micro_s, machine, notes)


def check_step(cfg: Config, machine: Machine | None = None, max_minutes: float | None = None) -> StepEstimate | None:
    """Raise ConfigError when one step of `cfg` cannot fit this machine's memory or would run longer than
    `max_minutes` (GRPO_APP_MAX_STEP_MINUTES); the message carries the estimate. Also refuses a
    `model.trainable_layers` above the model's layer count, read offline, before any run folder exists
    (the model load would refuse it too, with the same range, but only after the run had started).
    Returns the estimate."""
    from grpo_app.core.models import trainable_layers_problem

    layers = (model_shape(cfg.model.name) or {}).get("num_hidden_layers")
    problem = layers and trainable_layers_problem(cfg.model.trainable_layers, layers)
    if problem:
        raise ConfigError([("model.trainable_layers", problem)])
    est = estimate_step(cfg, machine)
    if est is None:
        return None
    limit = max_step_minutes() if max_minutes is None else max_minutes
    if machine is None and limit and est.seconds is not None and est.seconds > limit * 60:
        measured_gflops(again=True)  # before refusing on time: a second measurement, the better one counts
        est = estimate_step(cfg, None)
    problems = []
    avail = est.machine.available_bytes
    if est.peak_bytes > avail:
        problems.append(f"needs ~{est.peak_bytes / MB:,.0f} MB but this machine has ~{avail / MB:,.0f} MB available")
    if limit and est.seconds is not None and est.seconds > limit * 60:
        problems.append(
            f"would take ~{_minutes(est.seconds)}, over the limit of {limit:g} min a step (GRPO_APP_MAX_STEP_MINUTES)"
        )
    if problems:
        g = cfg.grpo
        raise ConfigError(
            [
                (
                    "one training step",
                    f"{g.prompts_per_step} prompts x G = {g.num_generations} completions of up to "
                    f"{g.max_completion_length} tokens {' and '.join(problems)}. Estimate: {est.summary()}. "
                    "Lower G, the prompts per step or the completion length.",
                )
            ]
        )
    return est
