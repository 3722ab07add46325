"""The ceiling GRPO can lift on GSM8K: the base model's sampled pass@k by difficulty (prints JSON).

    GRPO_APP_GSM8K_DIR=../shared/data/gsm8k python bench/ceiling.py --split train --n 64 --k 8 \\
        --out assets/ceiling_train.json

GRPO raises what a model can sometimes do; a problem none of a group's G answers solves gives every
answer the same reward, so its advantages are all 0 and it teaches nothing. This bench measures, for
a seeded random sample of `--n` problems of a GSM8K split, `--k` sampled answers each (the app's
sampler at `--temperature`, the app's answer reader, flexible and strict), and reports per difficulty
(GSM8K's number of calculation steps, from the reference solution):

* pass@1..k with bootstrap intervals (`evaluation.pass_k_curve`, the unbiased estimator);
* the share of problems with at least one correct answer among k (those a group of G = k can learn
  from), and the share solved by every answer (nothing left to teach);
* the expected share of groups of size G (2..k) that carry a signal: 1 - P(all wrong) - P(all right),
  from each problem's success count (hypergeometric, exact for G <= k).

`--model` takes any model the app loads, a trained run's `final` folder included; `--pair-with` an
earlier result of this bench (e.g. the base model's, from a GPU) puts both models' pass@k side by side on
the problems the two share, with an exact McNemar test on "solved at least once in k".

Reading the train split is how a preset is chosen; the test split is measured only to report it (a
preset is never selected on it). Accuracy does not depend on machine load; the seconds do.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from math import comb
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPO_APP_GSM8K_DIR", str(ROOT.parent / "shared" / "data" / "gsm8k"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import emit  # noqa: E402


def signal_share(c: int, k: int, g: int) -> float:
    """P(a group of g answers drawn without replacement from k, c of them correct, is mixed)."""
    if g > k:
        raise ValueError("group larger than the samples")
    total = comb(k, g)
    return 1.0 - (comb(k - c, g) + comb(c, g)) / total


def by_difficulty(records: list[dict]) -> dict[str, list[dict]]:
    """Records grouped by GSM8K difficulty (calculation steps), 5 and more together as '5+'."""
    out: dict[str, list[dict]] = {}
    for r in records:
        d = r["difficulty"]
        out.setdefault(str(d if d <= 4 else "5+"), []).append(r)
    return out


def summarize(records: list[dict], k: int, seed: int) -> dict:
    from grpo_app.evaluation.stats import pass_k_curve

    groups = sorted({g for g in (2, 4, 8, 16, 32, 64) if g <= k} | {k})
    n = len(records)
    out = {
        "n": n,
        "pass": pass_k_curve([r["correct"] for r in records], k, seed=seed),
        "strict_pass": pass_k_curve([r["strict_correct"] for r in records], k, seed=seed),
        "any_correct": round(sum(r["correct"] > 0 for r in records) / n, 4) if n else None,
        "all_correct": round(sum(r["correct"] == k for r in records) / n, 4) if n else None,
        "signal_share_by_G": {
            str(g): round(sum(signal_share(r["correct"], k, g) for r in records) / n, 4) if n else None for g in groups
        },
        "success_counts": {str(c): sum(r["correct"] == c for r in records) for c in range(k + 1)},
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=["train", "test"], default="train")
    ap.add_argument("--n", type=int, default=64, help="problems drawn (seeded) from the split")
    ap.add_argument("--k", type=int, default=8, help="sampled answers per problem")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (the presets train at 0.8)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64, help="answers per sampler batch")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--pair-with",
        default=None,
        metavar="JSON",
        help="an earlier result of this bench (e.g. the base model's): both models' pass@k on the problems the "
        "two share, and an exact McNemar test on 'solved at least once in k' (same split, k, temperature "
        "and token budget required)",
    )
    a = ap.parse_args()
    if a.n < 1 or not 1 <= a.k <= 64:
        ap.error("--n must be at least 1 and --k between 1 and 64")
    other = None
    if a.pair_with:  # checked before any sampling, so a mismatch does not fail after the work is done
        try:
            other = json.loads(Path(a.pair_with).read_text())
            mine = {"split": a.split, "k": a.k, "temperature": a.temperature, "max_new_tokens": a.max_new_tokens}
            differ = [f"{key} {other[key]!r} there, {v!r} here" for key, v in mine.items() if other[key] != v]
            if not other["records"] or not all("id" in r and "correct" in r for r in other["records"]):
                raise ValueError("no per-problem records with 'id' and 'correct'")
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--pair-with {a.pair_with}: not a result of this bench with records ({e}).")
        if differ:
            ap.error(f"--pair-with {a.pair_with}: measured differently ({'; '.join(differ)}).")

    import torch

    from grpo_app.core.config import DataConfig
    from grpo_app.core.data import load_gsm8k
    from grpo_app.evaluation.scoring import EvalSettings, load_for_eval, sample_pass_k

    problems, origin = load_gsm8k(a.split, DataConfig())
    picked = random.Random(a.seed).sample(problems, min(a.n, len(problems)))
    model, tok, _spec = load_for_eval(a.model)
    settings = EvalSettings(
        n=len(picked),
        seed=a.seed,
        max_new_tokens=a.max_new_tokens,
        batch_size=min(a.batch_size, 256),
        pass_k=a.k,
        pass_temperature=a.temperature,
    ).validate()
    settings.batch_size = a.batch_size  # may exceed the app's 256 (e.g. 1024 on a GPU)

    def progress(done: int, total: int) -> None:
        print(f"# {done}/{total} problems", file=sys.stderr, flush=True)

    res = sample_pass_k(model, tok, picked, settings, progress=progress)
    recs = res["records"]
    result = {
        "split": a.split,
        "origin": origin,
        "model": a.model,
        "sample": {"n": len(picked), "seed": a.seed, "of": len(problems)},
        "k": a.k,
        "temperature": a.temperature,
        "max_new_tokens": a.max_new_tokens,
        "machine": {"cores": os.cpu_count(), "torch": torch.__version__},
        "seconds": round(res["seconds"], 1),
        "all": summarize(recs, a.k, a.seed),
        "by_difficulty": {d: summarize(v, a.k, a.seed) for d, v in sorted(by_difficulty(recs).items())},
        "records": recs,
    }
    if other is not None:
        result["paired"] = pair(other, a.pair_with, recs, a.k, a.seed)
    emit(result, a.out)


def pair(other: dict, other_path: str, recs: list[dict], k: int, seed: int) -> dict:
    """This model's samples beside another result's, on the problems both answered (matched by id)."""
    from grpo_app.evaluation.stats import paired, pass_k_curve

    theirs = {r["id"]: r for r in other["records"]}
    common = [r for r in recs if r["id"] in theirs]
    them = [theirs[r["id"]] for r in common]

    def solved(rs):
        return [{"id": r["id"], "any": r["correct"] > 0} for r in rs]

    return {
        "with": other_path,
        "other_model": other.get("model"),
        "other_machine": other.get("machine"),
        "n": len(common),
        "other_pass": pass_k_curve([r["correct"] for r in them], k, seed=seed),
        "this_pass": pass_k_curve([r["correct"] for r in common], k, seed=seed),
        "solved_in_k": paired(solved(them), solved(common), "any"),  # only_base = only the other model
    }


if __name__ == "__main__":
    main()
