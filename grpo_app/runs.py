"""The run folder: its layout, its records, its checkpoints. No threads, no jobs (see manager.py).

A run folder `models/runs/<run_id>/` holds:
  config.yaml          the full config (written atomically)
  status.json          status, pid, stage/step, error (atomic: temp file + rename)
  metrics.jsonl        one line per logged step, appended and flushed
  events.jsonl         stage start/end, Fisher done, stop, resume, error
  memory.jsonl         RSS samples (every 0.5 s, also during generation)
  latest_step.json     the groups of the latest step: prompts, completions, rewards, advantages
  steps.jsonl          every step's groups (one line per step; completions cut to STEPS_MAX_CHARS characters).
                       Bounded: past STEPS_MAX_BYTES the file is rewritten (atomically) without every second
                       step of its older half (the first step and the newer half stay whole), so early training
                       becomes sparser but every step kept is complete; the latest step is always kept.
                       A re-done step (after a resume) replaces the earlier line of the same step when read.
  checkpoints/stage-K/checkpoint-N/   resumable (model, optimizer, RNG, engine_state.json, COMPLETE)
  ewc/stage-K/         Fisher + anchor after stage K
  final/               the trained model, loadable with from_pretrained
  eval/                evaluation results (JSON + CSV)

A crash at any moment leaves a readable run: JSONL readers skip a torn last line, and a run whose
status says "running" but whose process is gone is reported as "interrupted".
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import time
from pathlib import Path

import psutil

from .config import PROJECT_ROOT, Config, config_from_dict, load_yaml_text
from .fileio import append_jsonl, atomic_write_json, atomic_write_text, clean_json, read_json_object, read_jsonl

ACTIVE = ("running", "stopping")
STEPS_MAX_BYTES = 32 * 2**20  # steps.jsonl: ~2000 steps of 4 prompts x 8 completions of ~100 tokens
STEPS_MAX_CHARS = 1500  # characters kept of each completion in steps.jsonl
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,100}$")


# ------------------------------------------------------------------------------------------------
# Run folders
# ------------------------------------------------------------------------------------------------
def runs_root(cfg_root: str | None = None) -> Path:
    """Where runs live: GRPO_APP_RUNS_DIR (a server setting) wins over a config's run.output_dir."""
    root = os.environ.get("GRPO_APP_RUNS_DIR") or cfg_root or "models/runs"
    p = Path(root)
    if not p.is_absolute():
        p = PROJECT_ROOT / p
    return p.resolve()


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.id = self.path.name

    # paths
    config_path = property(lambda self: self.path / "config.yaml")
    status_path = property(lambda self: self.path / "status.json")
    metrics_path = property(lambda self: self.path / "metrics.jsonl")
    events_path = property(lambda self: self.path / "events.jsonl")
    memory_path = property(lambda self: self.path / "memory.jsonl")
    step_path = property(lambda self: self.path / "latest_step.json")
    steps_path = property(lambda self: self.path / "steps.jsonl")
    checkpoints_dir = property(lambda self: self.path / "checkpoints")
    ewc_dir = property(lambda self: self.path / "ewc")
    final_dir = property(lambda self: self.path / "final")
    eval_dir = property(lambda self: self.path / "eval")

    @classmethod
    def create(cls, root: Path, cfg: Config) -> RunDir:
        root.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        base = f"{stamp}-{cfg.run.name or cfg.preset or 'run'}"
        base = re.sub(r"[^A-Za-z0-9_\-]+", "-", base)[:80]
        rid, i = base, 1
        while (root / rid).exists():
            i += 1
            rid = f"{base}-{i}"
        path = root / rid
        path.mkdir(parents=True)
        rd = cls(path)
        atomic_write_text(rd.config_path, cfg.to_yaml())
        rd.write_status(status="created", total_steps=cfg.total_steps, stages=len(cfg.stages))
        return rd

    def config(self) -> Config:
        return config_from_dict(load_yaml_text(self.config_path.read_text(encoding="utf-8"), str(self.config_path)))

    # status
    def read_status(self) -> dict:
        return read_json_object(self.status_path) or {}

    def write_status(self, **fields) -> dict:
        st = self.read_status()
        st.update(fields)
        st["updated"] = time.time()
        atomic_write_json(self.status_path, st)
        return st

    def effective_status(self) -> str:
        """The stored status, except a 'running' run whose process is gone is 'interrupted'."""
        st = self.read_status()
        status = st.get("status", "unknown")
        if status in ACTIVE + ("created",) and not _process_alive(st.get("pid"), st.get("pid_started")):
            return "interrupted"
        return status

    # records
    def append_metric(self, rec: dict) -> None:
        append_jsonl(self.metrics_path, rec)

    def append_event(self, kind: str, **data) -> dict:
        ev = {"time": time.time(), "event": kind, **data}
        append_jsonl(self.events_path, ev)
        return ev

    def metrics(self) -> list[dict]:
        return read_jsonl(self.metrics_path)

    def events(self) -> list[dict]:
        return read_jsonl(self.events_path)

    def memory(self) -> list[dict]:
        return read_jsonl(self.memory_path)

    def append_step(self, snapshot: dict, max_bytes: int = STEPS_MAX_BYTES, max_chars: int = STEPS_MAX_CHARS) -> None:
        """Add one step's groups to steps.jsonl (see the layout above for the bound and what happens past it)."""
        append_jsonl(self.steps_path, step_record(snapshot, max_chars))
        try:
            size = self.steps_path.stat().st_size
        except OSError:
            return
        if size > max_bytes:
            self._thin_steps(max_bytes)

    def _thin_steps(self, max_bytes: int) -> None:
        lines = [json.dumps(clean_json(r)) + "\n" for r in self.steps()]
        size = sum(len(x.encode()) for x in lines)
        while size > max_bytes * 3 // 4 and len(lines) > 2:
            half = len(lines) // 2
            older = lines[1:half]
            if not older:  # two or three huge steps: keep the first and the latest
                lines = [lines[0], lines[-1]]
            else:
                lines = [lines[0], *older[1::2], *lines[half:]]
            size = sum(len(x.encode()) for x in lines)
        if size > max_bytes and len(lines) > 1:
            lines = lines[-1:]
        atomic_write_text(self.steps_path, "".join(lines))

    def steps(self) -> list[dict]:
        """Every recorded step (steps.jsonl), oldest first; a step written twice (resume) counts once, last wins."""
        by_step: dict[int, dict] = {}
        for rec in read_jsonl(self.steps_path):
            if isinstance(rec.get("step"), int) and isinstance(rec.get("groups"), list):
                by_step[rec["step"]] = rec
        return [by_step[k] for k in sorted(by_step)]

    def truncate_metrics_after(self, step: int) -> int:
        """Drop metric lines past `step` (they will be recomputed on resume); returns how many were dropped."""
        recs = self.metrics()
        keep = [r for r in recs if r.get("step", 0) <= step]
        atomic_write_text(self.metrics_path, "".join(json.dumps(clean_json(r)) + "\n" for r in keep))
        return len(recs) - len(keep)

    def has_final_model(self) -> bool:
        return (self.final_dir / "config.json").is_file()

    # checkpoints
    def checkpoints(self) -> list[dict]:
        """Complete checkpoints (with COMPLETE marker and engine_state.json), oldest first."""
        out = []
        if not self.checkpoints_dir.is_dir():
            return out
        for stage_dir in self.checkpoints_dir.glob("stage-*"):
            for ck in stage_dir.glob("checkpoint-*"):
                state = read_json_object(ck / "engine_state.json")
                if (ck / "COMPLETE").is_file() and state:
                    out.append({**state, "path": str(ck)})
        out.sort(key=lambda s: (s["stage_index"], s["stage_step"]))
        return out

    def latest_checkpoint(self) -> dict | None:
        cks = self.checkpoints()
        return cks[-1] if cks else None

    def prune_checkpoints(self, keep: int) -> None:
        for ck in self.checkpoints()[:-keep] if keep > 0 else []:
            shutil.rmtree(ck["path"], ignore_errors=True)

    def summary(self) -> dict:
        st = self.read_status()
        metrics = self.metrics()
        last = metrics[-1] if metrics else {}
        try:
            cfg = self.config()
            preset, stages = cfg.preset, " → ".join(s.name for s in cfg.stages)
            model = cfg.model.name
        except Exception:
            preset, stages, model = "?", "?", "?"
        started = st.get("started")
        ended = st.get("ended") or (st.get("updated") if self.effective_status() != "running" else time.time())
        return {
            "run_id": self.id,
            "status": self.effective_status(),
            "preset": preset,
            "model": model,
            "stages": stages,
            "steps": f"{last.get('step', 0)}/{st.get('total_steps', '?')}",
            "final_reward": last.get("reward"),
            "duration_s": (ended - started) if started and ended else None,
            "started": started,
            "has_final": self.has_final_model(),
            "error": st.get("error"),
        }


def step_record(snapshot: dict, max_chars: int = STEPS_MAX_CHARS) -> dict:
    """One steps.jsonl line from a step snapshot (`trainer._emit_groups` + the engine's stage fields):
    completions cut to `max_chars` characters (counted in 'clipped'), the system prompt left out."""
    clipped = 0

    def cut(text) -> str:
        nonlocal clipped
        text = str(text)
        if len(text) > max_chars:
            clipped += 1
            return text[:max_chars] + "…"
        return text

    groups = [
        {
            "problem_id": g.get("problem_id", ""),
            "question": g.get("question", ""),
            "answer": g.get("answer", ""),
            "completions": [cut(c) for c in g.get("completions") or []],
            **{k: g[k] for k in ("rewards", "totals", "mean", "std", "advantages") if k in g},
        }
        for g in snapshot.get("groups") or []
    ]
    keys = ("step", "stage", "stage_name", "stage_step", "weights", "scale_rewards")
    rec = {k: snapshot[k] for k in keys if k in snapshot}
    return {**rec, "time": time.time(), "groups": groups, "clipped": clipped}


def _process_alive(pid, started) -> bool:
    if not pid:
        return False
    try:
        p = psutil.Process(int(pid))
        if started is not None and abs(p.create_time() - float(started)) > 1.0:
            return False  # the pid was reused by another process
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def validate_run_id(run_id: str) -> str:
    run_id = (run_id or "").strip()
    if not RUN_ID_RE.match(run_id) or ".." in run_id:
        raise ValueError(f"'{run_id}' is not a run id (letters, digits, '-' and '_').")
    return run_id


def list_runs(root: Path) -> list[RunDir]:
    if not root.is_dir():
        return []
    runs = [RunDir(p) for p in root.iterdir() if p.is_dir() and (p / "config.yaml").is_file()]
    runs.sort(key=lambda r: r.id, reverse=True)
    return runs
