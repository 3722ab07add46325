"""A class's experiments side by side (issue 44): several runs' curves on shared charts, the settings in
which they differ, and a leaderboard of their comparisons on the same held-out problems.

* `settings_diff(runs)`: only the settings whose values differ between the runs (flattened config keys,
  `stages[1].steps`, `ewc.lam`, ...), one value per run; a stage some runs lack shows as "—".
* `leaderboard(runs, set_name)`: each run's saved Compare result on the problem set `set_name` (a file of its
  `eval/` folder, e.g. `gsm8k-n100-seed0-d0-99`): the trained model's accuracy with its 95% Wilson interval,
  the base's, and an exact McNemar p against the best run on the problems both answered (paired by problem
  id). Results on other problems (another draw, another data source) are left out with the reason, never
  ranked together. Runs without the result are listed as missing; `score_missing` scores them.
* `common_sets(runs)`: the problem sets at least one of the runs was scored on, most widely shared first.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from grpo_app.core.fileio import read_json
from grpo_app.core.run_folder import RunDir
from grpo_app.evaluation.scoring import CompareSpec, run_compare
from grpo_app.evaluation.stats import paired, wilson_interval

MAX_RUNS = 8
OVERLAY_METRICS = {  # chart name -> (metrics key, title, y axis)
    "reward": ("reward", "Mean reward per step", "reward"),
    "length": ("completion_length", "Answer length (tokens)", "tokens"),
    "ewc": ("ewc_penalty", "EWC penalty", "penalty"),
    "memory": ("rss_mb", "Memory (RSS, MB)", "MB"),
}


class SideBySideError(ValueError):
    """Runs that cannot be put side by side (too few, too many, unknown): the message says what to do."""


def check_runs(runs: list[RunDir]) -> list[RunDir]:
    ids = [r.id for r in runs]
    if len(set(ids)) != len(ids):
        raise SideBySideError("a run is picked twice; pick each run once.")
    if not 2 <= len(runs) <= MAX_RUNS:
        raise SideBySideError(f"pick 2 to {MAX_RUNS} runs to put side by side ({len(runs)} picked).")
    return runs


def _flat(value, prefix: str, out: dict) -> dict:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _flat(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value
    return out


def _show(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_show(v) for v in value)
    return "—" if value is None else str(value)


# settings that always differ and say nothing about the experiment
_IGNORED = ("run.name",)


def settings_diff(runs: list[RunDir]) -> list[dict]:
    """[{"setting": key, run_id: value, ...}] for every setting whose value differs between the runs."""
    flat = {}
    for run in runs:
        try:
            flat[run.id] = _flat(run.config().to_dict(), "", {})
        except Exception as e:  # noqa: BLE001 - a damaged config is shown, not a reason to fail the others
            flat[run.id] = {"config": f"unreadable ({type(e).__name__})"}
    keys = list(dict.fromkeys(k for f in flat.values() for k in f))
    rows = []
    for key in keys:
        if key in _IGNORED:
            continue
        values = [flat[r.id].get(key, "—") for r in runs]
        if len({repr(v) for v in values}) > 1:
            rows.append({"setting": key, **{r.id: _show(v) for r, v in zip(runs, values)}})
    return rows


def overlay_series(runs: list[RunDir], chart: str) -> list[dict]:
    """Per run: {"run": id, "steps", "values", "stages"} of one chart's metric (steps without a value left out)."""
    key = OVERLAY_METRICS[chart][0]
    out = []
    for run in runs:
        steps, values, stages = [], [], []
        for m in run.metrics():
            v = m.get(key)
            if m.get("step") is None or not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                continue
            steps.append(m["step"])
            values.append(float(v))
            stages.append(f"stage {int(m.get('stage', 0)) + 1}: {m.get('stage_name', '')}")
        out.append({"run": run.id, "steps": steps, "values": values, "stages": stages})
    return out


def saved_results(run: RunDir) -> dict[str, dict]:
    """The run's saved Compare results by name (eval/<name>.json; the stage x task matrices left out)."""
    out = {}
    if run.eval_dir.is_dir():
        for f in sorted(run.eval_dir.glob("*.json")):
            if f.stem.startswith("matrix-"):
                continue
            res = read_json(f)
            if isinstance(res, dict) and isinstance(res.get("trained"), dict) and "records" in res["trained"]:
                out[f.stem] = res
    return out


def common_sets(runs: list[RunDir]) -> list[tuple[str, int]]:
    """(problem set name, how many of the runs have it), most widely shared first."""
    counts: dict[str, int] = {}
    for run in runs:
        for name in saved_results(run):
            counts[name] = counts.get(name, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def gsm8k_set(n: int, seed: int) -> str:
    """The name CompareSpec.for_run gives GSM8K test (or its offline stand-in), all difficulties."""
    return f"gsm8k-n{n}-seed{seed}-d0-99"


def _problems_key(result: dict) -> str:
    """Which problems a result was scored on: the problems' digest in its cache key, else its question ids."""
    key = str(result.get("key") or "")
    if "-p" in key:
        return key.rsplit("-p", 1)[1]
    return ",".join(sorted(str(r.get("id")) for r in result["trained"]["records"]))


def leaderboard(runs: list[RunDir], set_name: str) -> dict:
    """Rows ranked by the trained model's accuracy on `set_name`, with the base's, intervals and p against
    the best; `missing`: runs with no result on it; `apart`: runs scored on other problems under that name."""
    found = {r.id: res for r in runs if (res := saved_results(r).get(set_name)) is not None}
    missing = [r.id for r in runs if r.id not in found]
    if not found:
        return {"set": set_name, "rows": [], "missing": missing, "apart": []}
    # the problems most of the results share are the board's; the others are set apart, not ranked with them
    keys = [_problems_key(res) for res in found.values()]
    board_key = max(set(keys), key=keys.count)
    apart = [rid for rid, k in zip(found, keys) if k != board_key]
    rows = []
    for rid, res in found.items():
        if rid in apart:
            continue
        recs = res["trained"]["records"]
        right = sum(bool(r.get("correct")) for r in recs)
        base = res["base"]["records"]
        base_right = sum(bool(r.get("correct")) for r in base)
        rows.append({
            "run": rid,
            "n": len(recs),
            "accuracy": right / len(recs) if recs else 0.0,
            "ci": list(wilson_interval(right, len(recs))),
            "format": res["trained"].get("summary", {}).get("format_rate"),
            "base_accuracy": base_right / len(base) if base else 0.0,
            "p_vs_base": (res.get("paired") or {}).get("p_value"),
            "records": recs,
        })
    rows.sort(key=lambda r: (-r["accuracy"], r["run"]))
    best = rows[0]
    for row in rows:
        if row is best:
            row["p_vs_best"] = None
        else:
            pr = paired(best["records"], row["records"])
            row["p_vs_best"] = pr["p_value"]
            row["paired_n"] = pr["n"]
    for row in rows:
        del row["records"]
    return {"set": set_name, "rows": rows, "missing": missing, "apart": apart}


def score_missing(runs: list[RunDir], n: int, seed: int, report: Callable | None = None,
                  should_stop: Callable[[], bool] | None = None) -> list[str]:
    """Score on GSM8K test (or its offline stand-in; n problems, `seed`) every run that has a trained model
    and no result under that name; returns the ids scored. `report(phase=..., done=, total=)` sees progress."""
    name = gsm8k_set(n, seed)
    todo = [r for r in runs if r.has_final_model() and name not in saved_results(r)]
    report = report or (lambda **kw: None)
    for i, run in enumerate(todo):
        if should_stop is not None and should_stop():
            raise InterruptedError("scoring cancelled")

        def say(i=i, run=run, **fields):
            report(phase=f"run {i + 1} of {len(todo)} ({run.id}): {fields.get('phase', '')}",
                   done=i, total=len(todo), **{k: v for k, v in fields.items() if k != "phase"})

        run_compare(CompareSpec.for_run(run, "gsm8k", n=n, seed=seed), say, should_stop)
    return [r.id for r in todo]
