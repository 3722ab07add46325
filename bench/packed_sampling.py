"""Sampling on oneDNN-packed weights (`grpo.packed_sampling`) against the plain sampler, side by side (JSON).

    python bench/packed_sampling.py --rounds 4 --out assets/packed_sampling.json [--metrics RUN/metrics.jsonl]

In one process on the embedded SmolLM2-135M, alternating plain and packed calls round by round (so both see
the same machine), two workloads:

* `training`: a training step's sampling as the progressive preset does it: 4 addition prompts x G = 8,
  temperature 0.8, 96 tokens, stopping at the answer line; the same seed for both, so both should sample the
  same tokens (the packed product differs from MKL's by float rounding only: `tokens_identical` says whether
  they did);
* `greedy`: an evaluation batch as Compare runs it: 32 distinct word problems, greedy, 256 tokens, stopping at
  the answer line; `answers_identical` compares the two calls' tokens.

Each packed call's time includes packing every weight (`packed_linears`, once per call); `pack_seconds` is
that cost alone, `packed_extra_mb` the resident memory the packed copy adds. With `--metrics` (a run's
metrics.jsonl), the sampling share of its steps and what the training speed-up would make of a whole step
(Amdahl's law).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import emit, machine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--metrics", default=None, help="a run's metrics.jsonl: the sampling share of its steps")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import psutil
    import torch

    from grpo_app.core.config import DataConfig
    from grpo_app.core.data import make_arithmetic, make_word_problems
    from grpo_app.core.models import load_model, set_threads
    from grpo_app.core.prompts import prompt_ids
    from grpo_app.training.sampler import SamplingParams, generate_completions, packed_linears, use_fast_attention

    threads = set_threads(0)
    model, tok, spec = load_model(a.model)
    use_fast_attention(model)
    system = DataConfig().system_prompt
    adds = make_arithmetic(4, seed=7, min_ops=1, max_ops=1, max_digits=2, operators="+")
    words = make_word_problems(32, seed=7)
    work = {
        "training": ([prompt_ids(tok, p.question, system) for p in adds for _ in range(8)],
                     dict(max_new_tokens=96, temperature=0.8, stop_at_answer=True, seed=11)),
        "greedy": ([prompt_ids(tok, p.question, system) for p in words],
                   dict(max_new_tokens=256, temperature=0.0, stop_at_answer=True)),
    }
    generate_completions(model, tok, work["training"][0][:8], SamplingParams(max_new_tokens=4, seed=0))  # warm-up

    proc = psutil.Process()
    before = proc.memory_info().rss / 2**20
    t0 = time.perf_counter()
    with torch.inference_mode(), packed_linears(model, rows=32) as layers:
        pack_s = time.perf_counter() - t0
        extra_mb = proc.memory_info().rss / 2**20 - before

    result = {"model": spec.label, "machine": {**machine(), "threads": threads}, "rounds": a.rounds,
              "packed_layers": layers, "pack_seconds": round(pack_s, 3), "packed_extra_mb": round(extra_mb, 1)}
    for name, (ids, kw) in work.items():
        secs = {"plain": [], "packed": []}
        outs = {}
        for _ in range(a.rounds):
            for mode in ("plain", "packed"):
                out = generate_completions(model, tok, ids, SamplingParams(**kw, packed_weights=mode == "packed"))
                secs[mode].append(out.seconds)
                outs[mode] = out
        med = {m: statistics.median(v) for m, v in secs.items()}
        result[name] = {
            "rows": len(ids),
            **{k: v for k, v in kw.items() if k != "seed"},
            "generated_tokens": {m: o.generated_tokens for m, o in outs.items()},
            "seconds": {m: [round(x, 2) for x in v] for m, v in secs.items()},
            "median_seconds": {m: round(v, 2) for m, v in med.items()},
            "packed_over_plain": round(med["packed"] / med["plain"], 3),
            ("tokens_identical" if name == "training" else "answers_identical"):
                outs["plain"].completion_ids == outs["packed"].completion_ids,
        }
    if a.metrics:
        rows = [json.loads(line) for line in Path(a.metrics).read_text().splitlines() if line.strip()]
        rows = [r for r in rows if r.get("gen_seconds") and r.get("step_seconds")]
        g, s = sum(r["gen_seconds"] for r in rows), sum(r["step_seconds"] for r in rows)
        ratio = result["training"]["packed_over_plain"]
        result["whole_step"] = {"metrics": a.metrics, "steps": len(rows), "sampling_share": round(g / s, 3),
                                "step_time_ratio": round(1 - g / s + g / s * ratio, 3)}
    emit(result, a.out)


if __name__ == "__main__":
    main()
