"""How often the base model writes the answer line when sampled: the chance GRPO has to learn the format
(prints JSON).

    python bench/format_rate.py --n 32 --k 8 --out assets/format_rate.json

GRPO can only reinforce what the sampler produces. The presets reward a final `#### <number>` line
(correctness reads only that line; strict and soft format pay for it), so the first steps learn the format
only if some of a step's sampled answers happen to write it. This bench samples `--k` answers to each of
the first `--n` problems of the classroom preset's first stage (its training pool: nothing held out is
read) as training samples them (the app's sampler at the preset's temperature, top-p and top-k and its
completion budget, stopping at a complete answer line), for the preset's prompt and for each `--variant`
named below (`hint` is the training hint of docs/experiments.md), and reports per variant:

* the share of answers with a `####` anywhere (soft format), ending in a `#### <number>` line (strict
  format), and right by each reading (strict: the `####` answer; flexible: else the last number);
* from those shares q, the chance that a step of G x P samples holds at least one answer line, or at
  least one `####` (which correctness reads even with words after the number): 1 - (1 - q)^(G*P), the
  per-step chance that the format signal exists at all.

Variants change only the words around the question; the problems, seeds and sampler are the same.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import emit  # noqa: E402

# name -> (system prompt, text after the question); None: the preset's own (its data.training_hint).
VARIANTS = {
    "preset": (None, None),
    "hint": (None, "\n\nEnd with the final answer on its own line as '#### <number>'."),
    "format_first": (
        "Always end your answer with a last line of the form '#### <number>': four # signs, a space and the "
        "number. Solve the math problem and show your work briefly.",
        "",
    ),
    "no_system_user_format": ("", "\n\nShow your work briefly, then give the final answer on the last line as '#### <number>'."),
}


def rates(texts: list[str], golds: list[str], group: int) -> dict:
    """The shares of `texts` with a `####`, ending in a `#### <number>` line, right by the strict and the
    flexible reading; and the chance that a step of `group` such answers holds at least one of the first two."""
    from grpo_app.core.answers import has_final_line
    from grpo_app.core.rewards import is_correct

    m = len(texts)
    soft = sum("####" in t for t in texts) / m
    strict = sum(has_final_line(t) for t in texts) / m
    return {
        "answers": m,
        "soft_format": round(soft, 4),
        "strict_format": round(strict, 4),
        "correct_strict": round(sum(is_correct(t, g, strict=True) for t, g in zip(texts, golds)) / m, 4),
        "correct_flexible": round(sum(is_correct(t, g, strict=False) for t, g in zip(texts, golds)) / m, 4),
        "p_step_has_answer_line": round(1 - (1 - strict) ** group, 4),
        "p_step_has_marker": round(1 - (1 - soft) ** group, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="classroom")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides (as the CLI's)")
    ap.add_argument("--stage", type=int, default=0, help="which stage's training pool (0 = the first)")
    ap.add_argument("--n", type=int, default=32, help="problems")
    ap.add_argument("--k", type=int, default=8, help="sampled answers per problem")
    ap.add_argument("--variant", action="append", default=[], choices=sorted(VARIANTS),
                    help="prompt variants to measure (repeatable; default: all)")
    ap.add_argument("--temperature", type=float, default=None, help="default: the preset's")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the preset's budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.n < 1 or not 1 <= a.k <= 64:
        ap.error("--n must be at least 1 and --k between 1 and 64")

    import time

    import torch

    from grpo_app.core.config import load_config
    from grpo_app.core.data import stage_pool
    from grpo_app.core.prompts import prompt_ids
    from grpo_app.evaluation.scoring import load_for_eval
    from grpo_app.training.sampler import SamplingParams, generate_completions

    cfg = load_config(a.config, a.set)
    stage = cfg.stages[a.stage]
    pool = stage_pool(stage, cfg.data, cfg.run.seed)
    problems = pool.problems[: a.n]
    model, tok, _spec = load_for_eval(cfg.model.name)
    temperature = cfg.grpo.temperature if a.temperature is None else a.temperature
    budget = cfg.grpo.max_completion_length if a.max_new_tokens is None else a.max_new_tokens
    group = cfg.grpo.generation_batch

    results = {}
    for name in a.variant or list(VARIANTS):
        system, suffix = VARIANTS[name]
        system = cfg.data.system_prompt if system is None else system
        suffix = cfg.data.training_hint if suffix is None else suffix
        ids = [prompt_ids(tok, p.question, system, suffix) for p in problems for _ in range(a.k)]
        t0 = time.perf_counter()
        texts = []
        for start in range(0, len(ids), 64):
            out = generate_completions(model, tok, ids[start : start + 64], SamplingParams(
                max_new_tokens=budget, temperature=temperature, top_p=cfg.grpo.top_p, top_k=cfg.grpo.top_k,
                stop_at_answer=True, seed=a.seed * 1_000_003 + start))
            texts += [tok.decode(c, skip_special_tokens=True) for c in out.completion_ids]
        golds = [p.answer for p in problems for _ in range(a.k)]
        results[name] = {
            "system_prompt": system,
            "after_question": suffix,
            **rates(texts, golds, group),
            "seconds": round(time.perf_counter() - t0, 1),
            "examples": texts[:3],
        }
        print(f"# {name}: strict {results[name]['strict_format']} soft {results[name]['soft_format']}", file=sys.stderr,
              flush=True)
    emit({
        "config": a.config,
        "overrides": a.set,
        "command": "python bench/format_rate.py " + " ".join(sys.argv[1:]),
        "stage": stage.name,
        "pool": pool.origin,
        "n": len(problems),
        "k": a.k,
        "temperature": temperature,
        "max_new_tokens": budget,
        "samples_per_step": group,
        "machine": {"cores": os.cpu_count(), "torch": torch.__version__},
        "variants": results,
    }, a.out)


if __name__ == "__main__":
    main()
