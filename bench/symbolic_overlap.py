"""Are the offline word problems GSM8K test questions in disguise? (prints JSON)

    GRPO_APP_GSM8K_DIR=../shared/data/gsm8k python bench/symbolic_overlap.py --out assets/symbolic_overlap.json

When GSM8K is not available, the app's GSM8K stages train on reasoning-gym's `gsm_symbolic` problems. Those
come from GSM-Symbolic, whose templates were written from GSM8K questions. This bench asks which split:
for every template the package draws from, one problem is generated (seeded), and its word set is
compared (Jaccard: shared words / all words, lower-cased letters only) with every question of the GSM8K
train and test splits. A template whose best match shares half its words or more tells its source
question's story with other names and numbers.

What follows for the app (data.GSM_SYMBOLIC_LEAK, evaluation.gsm8k_test_leak): a model trained on
gsm_symbolic has seen GSM8K test stories, so its GSM8K test score is not held out, and Compare says so.
Counts, not timings: load does not matter.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPO_APP_GSM8K_DIR", str(ROOT.parent / "shared" / "data" / "gsm8k"))

from bench.common import emit  # noqa: E402

SHARED = 0.5  # a best match at or above this share of words counts as the same story


def words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z]+", text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / max(1, len(a | b))


def best_match(question: str, pool: list[tuple[frozenset[str], str]]) -> tuple[float, str]:
    """The pool question sharing the largest share of words with `question`, and that share."""
    w = words(question)
    score, text = max(((jaccard(w, pw), q) for pw, q in pool), key=lambda x: x[0])
    return score, text


def templates() -> list[tuple[int, object]]:
    """(index, generator) for every gsm_symbolic template the package draws from."""
    from reasoning_gym.arithmetic.gsm_symbolic import generators_00_49, generators_50_99
    from reasoning_gym.arithmetic.gsm_symbolic.gsm_symbolic import tasks_ok

    return [(t, getattr(generators_00_49 if t < 50 else generators_50_99, f"generate_{t}")) for t in tasks_ok]


def measure(train: list[str], test: list[str], seed: int = 0) -> dict:
    pools = {name: [(words(q), q) for q in qs] for name, qs in (("train", train), ("test", test))}
    rows = []
    for t, gen in templates():
        q = gen(random.Random(seed))["question"]
        row = {"template": t, "generated": q}
        for name, pool in pools.items():
            score, text = best_match(q, pool)
            row[f"best_{name}"] = round(score, 3)
            row[f"best_{name}_question"] = text[:200]
        rows.append(row)
    n = len(rows)

    def summary(name: str) -> dict:
        scores = sorted(r[f"best_{name}"] for r in rows)
        return {"shared_half_or_more": sum(s >= SHARED for s in scores), "median_best": scores[n // 2]}

    return {"templates": n, "threshold": SHARED, "train": summary("train"), "test": summary("test"), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="seed of the one problem generated per template")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    folder = Path(os.environ["GRPO_APP_GSM8K_DIR"])

    def load(split: str) -> list[str]:
        with open(folder / f"{split}.jsonl", encoding="utf-8") as f:
            return [json.loads(line)["question"] for line in f if line.strip()]

    result = measure(load("train"), load("test"), a.seed)
    result["command"] = "python bench/symbolic_overlap.py" + (f" --out {a.out}" if a.out else "")
    emit(result, a.out)


if __name__ == "__main__":
    main()
