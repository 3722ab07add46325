"""What a page shows about training: a "view" of the live job or of a run folder (no Gradio import).

A view is a plain dict: run_id, state, status, metrics, events, memory, latest_step, stages (the
config's plan), total_steps, started, active, plus three change markers: `version` changes when
anything but the memory samples changed, `charts_version` only when what the step charts and the run log
draw changed (the logged steps, the events; not a status or phase update, several of which come in one
step), `mem_version` when memory samples arrived. Pages compare them with what they last drew and skip
unchanged figures: every redraw is a request each page makes, and a request costs the server CPU that is
taken from the training (the Train tab's are plain routes, 1-4 ms; a Gradio event costs 3-16 ms, more through
the queue; docs/performance.md).

The Train tab follows, in order: the job this server runs, or the last one it launched (from the Train
tab or a Resume on the Runs tab; its failure included, even when older run folders are newer); a job
another process (e.g. the CLI) is running now in a newer folder, followed through its files; on a server
that launched nothing yet, the newest run folder; otherwise nothing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from grpo_app.core.config import ConfigError
from grpo_app.core.run_folder import ACTIVE, RunDir
from grpo_app.runs.manager import RunManager

STATE_WORDS = {
    "idle": "no run yet",
    "created": "starting",
    "running": "running",
    "stopping": "stopping",
    "stopped": "stopped (resumable)",
    "completed": "completed",
    "failed": "failed",
    "interrupted": "interrupted (resumable)",
    "damaged": "damaged (see the Runs tab)",
}

# A stopped or interrupted run is resumable only when it holds a complete checkpoint: one stopped before its
# first step ended has none, and its badge must not promise a Resume (issue 45, 4).
RESUMABLE_WORDS = {"stopped": "stopped (resumable)", "interrupted": "interrupted (resumable)"}
NOT_RESUMABLE_WORDS = {
    "stopped": "stopped (nothing to resume: no step completed; Start again)",
    "interrupted": "interrupted (nothing to resume: no step completed; Start again)",
}

_PLAN_CACHE: dict[str, tuple] = {}
_RESUMABLE_CACHE: dict[tuple, bool] = {}
_DISK_CACHE: dict[str, dict] = {}
_LOCK = threading.Lock()


def empty_view() -> dict:
    return {
        "run_id": None,
        "state": "idle",
        "status": {"status": "idle"},
        "metrics": [],
        "events": [],
        "memory": [],
        "latest_step": None,
        "stages": [],
        "total_steps": 0,
        "started": None,
        "active": False,
        "live": False,
        "version": ("none",),
        "charts_version": ("none",),
        "mem_version": ("none",),
    }


def _sig(path: Path):
    try:
        st = path.stat()
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return None


def plan(run: RunDir) -> tuple[list[dict], int, dict]:
    """The stages a run was configured with ([{name, steps}]), its total steps, and its reward weights."""
    key = str(run.path)
    sig = _sig(run.config_path)
    with _LOCK:
        hit = _PLAN_CACHE.get(key)
        if hit is not None and hit[0] == sig:
            return hit[1]
    try:
        cfg = run.config()
        value = ([{"name": s.name, "steps": s.steps} for s in cfg.stages], cfg.total_steps, dict(cfg.rewards.weights))
    except ConfigError:  # a damaged config.yaml: the run is shown without its plan (its state says 'damaged')
        value = ([], 0, {})
    with _LOCK:
        _PLAN_CACHE[key] = (sig, value)
    return value


def live_view(manager: RunManager) -> dict:
    run = manager.current_run
    if run is None:
        return empty_view()
    snap = manager.snapshot()
    stages, total, _ = plan(run)
    status = snap["status"] or {}
    state = status.get("status", "unknown")
    if not snap["active"] and state in ACTIVE:
        state = run.effective_status()
    return {
        "run_id": run.id,
        "state": state,
        "resumable": None if snap["active"] else _resumable_at(run, state, snap["version"]),
        "status": status,
        "metrics": snap["metrics"],
        "events": snap["events"],
        "memory": snap["memory"],
        "latest_step": snap["latest_step"],
        "stages": stages,
        "total_steps": total or status.get("total_steps") or 0,
        "started": status.get("started"),
        "active": bool(snap["active"]),
        "live": True,
        "version": (run.id, "live", snap["version"], snap["active"]),
        "charts_version": (run.id, "live", len(snap["metrics"]), len(snap["events"])),
        "mem_version": (run.id, "live", len(snap["memory"])),
    }


def disk_view(run: RunDir) -> dict:
    """A run folder read from its files; re-read only when a file changed."""
    key = str(run.path)
    sigs = tuple(_sig(p) for p in (run.metrics_path, run.events_path, run.status_path, run.step_path, run.config_path))
    mem_sig = _sig(run.memory_path)
    state = run.effective_status()
    with _LOCK:
        hit = _DISK_CACHE.get(key)
    if hit is None or hit["sigs"] != sigs or hit["view"]["state"] != state:
        status = run.read_status()
        if state == "damaged":
            status = {**status, "error": run.damage()}
        stages, total, _ = plan(run)
        view = {
            "run_id": run.id,
            "state": state,
            "resumable": resumable(run) if state in RESUMABLE_WORDS else None,
            "status": status,
            "metrics": run.metrics(),
            "events": run.events(),
            "memory": [],
            "latest_step": run.latest_step(),
            "stages": stages,
            "total_steps": total or status.get("total_steps") or 0,
            "started": status.get("started"),
            "active": state in ACTIVE,
            "live": False,
            "version": (run.id, "disk", sigs, state),
            "charts_version": (run.id, "disk", sigs[0], sigs[1], sigs[4]),  # metrics, events, config
            "mem_version": None,
        }
        hit = {"sigs": sigs, "view": view, "mem_sig": None}
    if hit["mem_sig"] != mem_sig:
        hit["view"]["memory"] = run.memory()
        hit["view"]["mem_version"] = (run.id, "disk", mem_sig)
        hit["mem_sig"] = mem_sig
    with _LOCK:
        _DISK_CACHE.pop(key, None)  # re-insert: the dict's order is least recently used first
        _DISK_CACHE[key] = hit
        while len(_DISK_CACHE) > 16:
            _DISK_CACHE.pop(next(iter(_DISK_CACHE)))
    return dict(hit["view"])


def current_view(manager: RunManager) -> dict:
    """This server's current or last job; else a newer job running in another process; else the newest
    run folder; else an empty view (see the module docstring)."""
    if manager.active:
        return live_view(manager)
    runs = manager.runs()
    newest = runs[0] if runs else None
    cur = manager.current_run
    if cur is not None and cur.config_path.is_file():
        if newest is not None and newest.id != cur.id and newest.effective_status() in ACTIVE:
            return disk_view(newest)  # another process trains now: that is what is happening on this machine
        return live_view(manager)
    if newest is not None:
        return disk_view(newest)
    return empty_view()


# ------------------------------------------------------------------------------------------------
# Resume
# ------------------------------------------------------------------------------------------------
def resumable(run: RunDir) -> bool:
    return run.effective_status() in ("stopped", "interrupted", "failed") and run.latest_checkpoint() is not None


def _resumable_at(run: RunDir, state: str, version) -> bool | None:
    """`resumable(run)` for a stopped or interrupted live view, looked up once per change of the job's store
    (the view is polled by every page; a stopped job's store no longer changes)."""
    if state not in RESUMABLE_WORDS:
        return None
    key = (run.id, state, version)
    with _LOCK:
        hit = _RESUMABLE_CACHE.get(key)
    if hit is None:
        hit = resumable(run)
        with _LOCK:
            if len(_RESUMABLE_CACHE) > 64:
                _RESUMABLE_CACHE.clear()
            _RESUMABLE_CACHE[key] = hit
    return hit


def state_text(view: dict) -> str:
    """The badge's words for a view's state: a stopped run says whether Resume can continue it."""
    state = view.get("state", "idle")
    if state in RESUMABLE_WORDS and view.get("resumable") is not None:
        return (RESUMABLE_WORDS if view["resumable"] else NOT_RESUMABLE_WORDS)[state]
    return STATE_WORDS.get(state, state)


def resume_target(manager: RunManager) -> RunDir | None:
    """The run 'Resume' continues: this server's last run if it can be resumed, else the newest resumable run."""
    cur = manager.current_run
    if cur is not None and not manager.active and resumable(cur):
        return cur
    for run in manager.runs()[:20]:
        if resumable(run):
            return run
    return None


# ------------------------------------------------------------------------------------------------
# Progress: stage k/n, step, elapsed, ETA, tokens/s
# ------------------------------------------------------------------------------------------------
def job_start(view: dict) -> float | None:
    """Start of the current (or last) job: the last 'resumed' event, else the run's start."""
    for ev in reversed(view.get("events") or []):
        if ev.get("event") == "resumed":
            return ev.get("time")
    return view.get("started")


def progress(view: dict, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    st = view.get("status") or {}
    metrics = view.get("metrics") or []
    last = metrics[-1] if metrics else {}
    n_stages = len(view.get("stages") or []) or int(st.get("stages") or 0)
    stage = st.get("stage", last.get("stage"))
    step = int(last.get("step") or st.get("step") or 0)
    total = int(view.get("total_steps") or st.get("total_steps") or 0)
    start = job_start(view)
    if view.get("active"):
        elapsed = now - start if start else None
    else:
        ended = st.get("ended") or st.get("updated")
        elapsed = (ended - start) if (start and ended and ended >= start) else None
    eta = None
    if view.get("active") and total and step < total:
        recent = [m.get("step_seconds") for m in metrics[-5:] if m.get("step_seconds")]
        if recent:
            per_step = sorted(recent)[len(recent) // 2]
            eta = per_step * (total - step)
            fisher = [ev.get("seconds") for ev in view.get("events") or [] if ev.get("event") == "fisher_done"]
            if fisher and stage is not None and n_stages:
                eta += fisher[-1] * max(0, n_stages - 1 - int(stage))  # Fisher passes still ahead
    return {
        "run_id": view.get("run_id"),
        "state": view.get("state", "idle"),
        "state_text": state_text(view),
        "stage": (int(stage) + 1) if stage is not None else None,
        "n_stages": n_stages,
        "stage_name": st.get("stage_name", last.get("stage_name")),
        "step": step,
        "total_steps": total,
        "elapsed_s": elapsed,
        "eta_s": eta,
        "tokens_per_s": last.get("tokens_per_s"),
        "phase": st.get("phase"),
        "error": st.get("error"),
        "reward": last.get("reward"),
    }


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = int(round(max(0.0, seconds)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
