"""Answers across training: the problems a run's steps sampled, and one problem's groups step by step.

Reads the run folder's steps.jsonl (`RunDir.steps()`; written by the reporter at every step, bounded, see
runs.py). A problem is named by its problem id (e.g. `arith-43-7`, `gsm8k-train-120`), or by its question
where a record has no id. Pure functions of the records, so the Runs tab and `python -m grpo_app answers`
show the same thing; `load_steps` keeps the last parse per file so moving a slider does not re-read it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from grpo_app.core.run_folder import RunDir

_CACHE: dict[str, tuple[tuple, list[dict]]] = {}
_LOCK = threading.Lock()
CORRECTNESS = ("correctness", "lenient_correctness")


def load_steps(run: RunDir) -> list[dict]:
    """`run.steps()`, parsed again only when steps.jsonl changed (size or modification time)."""
    path: Path = run.steps_path
    try:
        st = path.stat()
        sig = (st.st_size, st.st_mtime_ns)
    except OSError:
        return []
    key = str(path)
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None and hit[0] == sig:
        return hit[1]
    steps = run.steps()
    with _LOCK:
        _CACHE[key] = (sig, steps)
        if len(_CACHE) > 8:
            _CACHE.pop(next(iter(_CACHE)))
    return steps


def problem_key(group: dict) -> str:
    return str(group.get("problem_id") or "") or str(group.get("question", ""))


def problems(steps: list[dict]) -> list[dict]:
    """Every problem the recorded steps sampled: key, problem_id, question, answer, steps (where it was
    sampled, in order). Most often seen first, then by first appearance."""
    out: dict[str, dict] = {}
    for rec in steps:
        for g in rec.get("groups") or []:
            key = problem_key(g)
            p = out.setdefault(
                key,
                {
                    "key": key,
                    "problem_id": g.get("problem_id", ""),
                    "question": g.get("question", ""),
                    "answer": g.get("answer", ""),
                    "steps": [],
                },
            )
            p["steps"].append(rec.get("step"))
    return sorted(out.values(), key=lambda p: (-len(p["steps"]), p["steps"][0]))


def find_problem(steps: list[dict], text: str) -> dict | None:
    """The problem named by `text`: its key / problem id, else its 1-based number in `problems(steps)`."""
    ps = problems(steps)
    text = str(text or "").strip()
    for p in ps:
        if text and text in (p["key"], p["problem_id"]):
            return p
    if text.isdigit() and 1 <= int(text) <= len(ps):
        return ps[int(text) - 1]
    return None


def problem_history(steps: list[dict], key: str) -> list[dict]:
    """One entry per time the problem was sampled, oldest first: the step's fields (step, stage, stage_name,
    weights, scale_rewards) and its 'group' (completions, rewards, totals, mean, std, advantages)."""
    out = []
    for rec in steps:
        for g in rec.get("groups") or []:
            if problem_key(g) == key:
                out.append({**{k: v for k, v in rec.items() if k != "groups"}, "group": g})
    return out


def step_at(steps: list[dict], step: int) -> dict | None:
    """The recorded step numbered `step`, or None (older steps may have been thinned, see runs.py)."""
    return next((rec for rec in steps if rec.get("step") == step), None)


def correct_count(group: dict) -> int | None:
    """How many completions the correctness reward paid (None if the run did not use one)."""
    for name in CORRECTNESS:
        vals = (group.get("rewards") or {}).get(name)
        if vals is not None:
            return sum(1 for v in vals if v and float(v) >= 1.0)
    return None


def as_step(entry: dict) -> dict:
    """A history entry as a one-group step snapshot (what `ui.render.step_html` draws)."""
    return {**{k: v for k, v in entry.items() if k != "group"}, "groups": [entry["group"]]}


def forced_span(group: dict, i: int) -> tuple[int, int] | None:
    """[start, end) in completion `i`'s text of the answer-line hint the trainer wrote for it (trainer.py,
    departure 8), or None: it sampled every token. Records from before the hint was recorded have no spans."""
    spans = group.get("forced") or []
    span = spans[i] if i < len(spans) else None
    if isinstance(span, (list, tuple)) and len(span) == 2:
        return int(span[0]), int(span[1])
    return None
