"""The statistics of a comparison: 95% Wilson intervals, the exact McNemar test on paired answers, and
pass@k (the unbiased estimator of Chen et al. 2021, with a percentile bootstrap interval over problems).
Also the floor of a task that a constant answer earns (`modal_answer`).
Pure functions of counts; no model, no files."""

from __future__ import annotations

import math
from collections import Counter

Z95 = 1.959963984540054
BOOTSTRAP_RESAMPLES = 2000


def modal_answer(golds: list[str]) -> tuple[str, float] | None:
    """The most common right answer of a problem set (ties: the shortest, then the first in sort order) and its share:
    what a model that always wrote that one answer would score. One-digit taking-away stories come out as 1 about a
    third of the time (measured 2026-12-03), so their accuracy is read against that floor, not against 0.
    None for no problems."""
    counts = Counter(golds)
    if not counts:
        return None
    top = max(counts.values())
    answer = min((g for g, c in counts.items() if c == top), key=lambda g: (len(g), g))
    return answer, top / len(golds)


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval for k successes out of n (well-behaved near 0 and 1)."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # The bounds are exactly 0 at k = 0 and exactly 1 at k = n (centre - half only rounds to ~1e-17 there).
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (lo, hi)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: b, c = discordant pairs (only A right, only B right)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(base: list[dict], trained: list[dict], key: str = "correct") -> dict:
    """McNemar on the same problems: b = only base right, c = only trained right."""
    tb = {r["id"]: r[key] for r in trained}
    pairs = [(r[key], tb[r["id"]]) for r in base if r["id"] in tb]
    b = sum(1 for x, y in pairs if x and not y)
    c = sum(1 for x, y in pairs if y and not x)
    n = len(pairs)
    diff = (sum(y for _, y in pairs) - sum(x for x, _ in pairs)) / n if n else 0.0
    return {
        "n": n,
        "only_base": b,
        "only_trained": c,
        "both": sum(1 for x, y in pairs if x and y),
        "neither": sum(1 for x, y in pairs if not x and not y),
        "difference": diff,
        "p_value": mcnemar_exact(b, c),
    }


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are right (Chen et al. 2021): 1 - C(n-c, k) / C(n, k),
    the chance that k of the n samples drawn without replacement contain a right one."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k}).")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_k_curve(correct: list[int], n: int, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES) -> dict:
    """pass@1..n averaged over problems (`correct[i]` = right samples of problem i, out of n), with a 95%
    percentile bootstrap interval over problems. A resample only changes how often each count c occurs, so
    it is drawn as multinomial counts of c (the same distribution as resampling problems, far cheaper)."""
    import numpy as np

    m = len(correct)
    ks = list(range(1, n + 1))
    if m == 0:
        return {"k": ks, "pass": [0.0] * n, "ci": [[0.0, 1.0] for _ in ks], "n_problems": 0, "n_samples": n}
    table = np.array([[pass_at_k(n, c, k) for k in ks] for c in range(n + 1)])  # [c, k]
    freq = np.bincount(np.asarray(correct, dtype=int), minlength=n + 1).astype(float)
    point = freq @ table / m
    draws = np.random.default_rng(seed).multinomial(m, freq / m, size=resamples) @ table / m  # [B, k]
    lo, hi = np.percentile(draws, [2.5, 97.5], axis=0)
    ci = [[float(min(a, p)), float(max(b, p))] for a, b, p in zip(lo, hi, point)]
    return {"k": ks, "pass": [float(x) for x in point], "ci": ci, "n_problems": m, "n_samples": n}
