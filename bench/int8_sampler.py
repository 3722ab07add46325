"""Would sampling from an int8 copy of the policy pay? Decode speed and the sampler-policy mismatch (JSON).

    python bench/int8_sampler.py --batch 32 --tokens 96 --out assets/int8_sampler.json

A lever named in issue #20: sample GRPO's completions from a dynamically quantized int8 copy of the
policy (`models.quantize_int8`: every nn.Linear int8, activations quantized on the fly; the LM head
untied and quantized too) and correct the off-policy gap with a truncated importance weight per token.
Before building it, this bench measures, in one process on the embedded SmolLM2-135M with the classroom
preset's sampling (G = 8, temperature 0.8, addition prompts):

* the sampler's speed, fp32 vs int8, whole generation calls of `--batch` rows and `--tokens` tokens
  (no early stop, so both decode the same number of steps), best of `--repeats`; and what building the
  int8 copy costs (it would be rebuilt after every optimizer step);
* the mismatch on completions the int8 copy sampled: per token, log q (int8 copy) and log p (fp32
  policy) of the sampled token at the sampling temperature, both by a teacher-forced forward pass of
  one row; the mean of log q - log p, and the importance ratio p/q (mean, quantiles, share above 2, the
  usual truncation cap). Caveat, measured: dynamic quantization scales activations per tensor, so the
  teacher-forced pass (one row, the whole sequence) and the sampler's decode steps (one token, all rows)
  quantize differently and the teacher-forced q is not exactly the q the tokens were drawn from; the
  mean of log q - log p then need not be >= 0 as a KL(q || p) would. A correction in training would
  have to record log q in the sampler itself.

The share of a classroom step that is sampling comes from a run's metrics (`--metrics`: gen_seconds /
step_seconds of its steps), so the gain on a whole step is bounded by Amdahl's law.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import emit  # noqa: E402


def token_logps(model, prompt: list[int], completion: list[int], temperature: float):
    """log-probabilities at `temperature` of each completion token, teacher-forced (one row)."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--batch", type=int, default=32, help="rows per generation call (prompts x G)")
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--metrics", default=None, help="a run's metrics.jsonl: the sampling share of its steps")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import torch

    from grpo_app.core.config import DataConfig
    from grpo_app.core.data import make_arithmetic
    from grpo_app.core.models import load_model, quantize_int8, set_threads
    from grpo_app.core.prompts import prompt_ids
    from grpo_app.training.sampler import SamplingParams, generate_completions, use_fast_attention

    threads = set_threads(0)
    model, tok, spec = load_model(a.model)
    model.eval()
    t0 = time.perf_counter()
    q = quantize_int8(model)
    build_s = time.perf_counter() - t0
    use_fast_attention(model)
    use_fast_attention(q)

    probs = make_arithmetic(a.batch // a.g, seed=7, min_ops=1, max_ops=1, max_digits=2, operators="+")
    ids = [prompt_ids(tok, p.question, DataConfig().system_prompt) for p in probs for _ in range(a.g)]

    def gen(m, seed: int, stop: bool):
        sp = SamplingParams(max_new_tokens=a.tokens, temperature=a.temperature, stop_at_answer=stop, seed=seed)
        return generate_completions(m, tok, ids, sp, eos_token_ids=None if stop else [-1])

    gen(model, 0, False), gen(q, 0, False)  # warm-up
    speed = {}
    for name, m in (("fp32", model), ("int8", q)):
        runs = [gen(m, r, False) for r in range(a.repeats)]
        best = min(runs, key=lambda o: o.seconds)
        speed[name] = {
            "seconds": round(best.seconds, 2),
            "tokens_per_s": round(best.generated_tokens / best.seconds, 1),
        }
    speedup = speed["fp32"]["seconds"] / speed["int8"]["seconds"]

    # the mismatch, on what the int8 copy samples as it would in training (with the early stop)
    out = gen(q, 123, True)
    lq, lp = [], []
    for prompt, comp in zip(ids, out.completion_ids):
        if comp:
            lq.append(token_logps(q, prompt, comp, a.temperature))
            lp.append(token_logps(model, prompt, comp, a.temperature))
    lq, lp = torch.cat(lq), torch.cat(lp)
    ratio = torch.exp(lp - lq)
    qs = torch.quantile(ratio, torch.tensor([0.01, 0.5, 0.99])).tolist()
    mismatch = {
        "tokens": int(ratio.numel()),
        "mean_logq_minus_logp": round(float((lq - lp).mean()), 5),
        "ratio_mean": round(float(ratio.mean()), 4),
        "ratio_p01_p50_p99": [round(x, 4) for x in qs],
        "ratio_max": round(float(ratio.max()), 3),
        "share_ratio_above_2": round(float((ratio > 2).float().mean()), 5),
        "share_ratio_below_half": round(float((ratio < 0.5).float().mean()), 5),
    }

    share = None
    if a.metrics:
        rows = [json.loads(line) for line in Path(a.metrics).read_text().splitlines() if line.strip()]
        rows = [r for r in rows if r.get("gen_seconds") and r.get("step_seconds")]
        trained = [r for r in rows if r["step_seconds"] > r["gen_seconds"] * 1.05]  # steps that also trained
        if trained:
            g = sum(r["gen_seconds"] for r in trained)
            s = sum(r["step_seconds"] for r in trained)
            share = {
                "steps": len(trained),
                "sampling_share": round(g / s, 3),
                "step_speedup_bound": round(1 / (1 - g / s + g / s / speedup), 3),
            }

    result = {
        "model": spec.label,
        "machine": {"cores": os.cpu_count(), "threads": threads, "torch": torch.__version__},
        "batch": a.batch,
        "g": a.g,
        "tokens": a.tokens,
        "temperature": a.temperature,
        "int8_copy_build_seconds": round(build_s, 2),
        "speed": speed,
        "sampler_speedup": round(speedup, 3),
        "mismatch": mismatch,
        "classroom_step": share,
    }
    emit(result, a.out)


if __name__ == "__main__":
    main()
