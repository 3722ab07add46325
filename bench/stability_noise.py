"""How often would a model that forgot nothing fail issue 42's stability cell? Reads stage × task matrices and
prints JSON.

    python bench/stability_noise.py assets/matrix_progressive_st3lam3_seed1_ewc.json [...] [--bar 3] [--out F]

The cell asks every earlier task to stay within `--bar` points of its best. A stage-end model answers some of
an earlier task's problems differently from the model before it (the matrix's paired counts: `only_before`
right before and wrong after, `only_after` the other way; D = their sum, the discordant problems). If the
stage changed nothing the model knows, each of those D problems is as likely to flip one way as the other
(McNemar's null), and the read change is (only_after − only_before) / n. `p_fail_if_kept` is the exact chance,
under that null, of a read loss of more than `--bar` points against the row before: how often measurement
alone fails a model that kept everything. It is a lower bound for the cell as written (against the task's
best row, the highest of several noisy reads). `p_all_pass_if_kept` multiplies the cells' chances to pass
(the cells of one matrix share problems, so this is a rough figure).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def p_fail_if_kept(only_before: int, only_after: int, n: int, bar: float) -> float:
    """P(read loss > bar points | each discordant problem flips either way with probability 1/2)."""
    d = only_before + only_after
    # the read change in points is 100 * (2 * after - d) / n; a loss of more than `bar` points fails
    fails = [a for a in range(d + 1) if 100.0 * (d - 2 * a) / n > bar + 1e-9]
    return sum(math.comb(d, a) for a in fails) / 2**d if d else 0.0


def analyse(matrix: dict, bar: float) -> dict:
    cells, tasks = [], matrix.get("tasks") or []
    for k, row in enumerate(matrix.get("rows") or []):
        for j, cell in enumerate(row):
            vb = cell.get("vs_before") if j < k else None
            if not vb:
                continue
            b, c, n = int(vb["only_before"]), int(vb["only_after"]), int(cell["n"])
            cells.append({
                "after_stage": k + 1,
                "task": j + 1,
                "task_name": tasks[j].get("name", "") if j < len(tasks) else "",
                "change_points": round(100.0 * (c - b) / n, 1),
                "discordant": b + c,
                "n": n,
                "p_fail_if_kept": round(p_fail_if_kept(b, c, n, bar), 4),
            })
    keep = math.prod(1.0 - x["p_fail_if_kept"] for x in cells)
    return {"run_id": matrix.get("run_id"), "cells": cells, "p_all_pass_if_kept": round(keep, 4)}


def main() -> None:
    from bench.common import emit

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("matrices", nargs="+", help="matrix JSON files (compare --matrix, bench/learning.py --matrix)")
    ap.add_argument("--bar", type=float, default=3.0, help="points an earlier task may lose (issue 42: 3)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    res = {"bar_points": a.bar, "matrices": {}}
    for f in a.matrices:
        res["matrices"][Path(f).name] = analyse(json.loads(Path(f).read_text()), a.bar)
    emit(res, a.out)


if __name__ == "__main__":
    main()
