"""Run folders, the live metrics store, and the RunManager that owns the one training job.

A run folder `models/runs/<run_id>/` holds:
  config.yaml          the full config (written atomically)
  status.json          status, pid, stage/step, error (atomic: temp file + rename)
  metrics.jsonl        one line per logged step, appended and flushed
  events.jsonl         stage start/end, Fisher done, stop, resume, error
  memory.jsonl         RSS samples (every 0.5 s, also during generation)
  latest_step.json     the groups of the latest step: prompts, completions, rewards, advantages
  checkpoints/stage-K/checkpoint-N/   resumable (model, optimizer, RNG, engine_state.json, COMPLETE)
  ewc/stage-K/         Fisher + anchor after stage K
  final/               the trained model, loadable with from_pretrained
  eval/                evaluation results (JSON + CSV)

A crash at any moment leaves a readable run: JSONL readers skip a torn last line, and a run whose
status says "running" but whose process is gone is reported as "interrupted".
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import shutil
import threading
import time
import traceback
import uuid
from pathlib import Path

import psutil

from .config import PROJECT_ROOT, Config, config_from_dict, load_yaml_text

ACTIVE = ("running", "stopping")
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,100}$")


# ------------------------------------------------------------------------------------------------
# Crash-safe file writing
# ------------------------------------------------------------------------------------------------
def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, default=_json_default))


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def append_jsonl(path: Path, obj: dict) -> None:
    """Append one JSON line (NaN/inf become null), flushed and fsynced so a crash loses at most it."""
    line = json.dumps(_clean(obj), default=_json_default)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _clean(obj):
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line; a torn last line (crash mid-write) is skipped."""
    out = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return out


def read_json(path: Path, default=None):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return default


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
        return read_json(self.status_path, {}) or {}

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

    def truncate_metrics_after(self, step: int) -> int:
        """Drop metric lines past `step` (they will be recomputed on resume); returns how many were dropped."""
        recs = self.metrics()
        keep = [r for r in recs if r.get("step", 0) <= step]
        atomic_write_text(self.metrics_path, "".join(json.dumps(_clean(r)) + "\n" for r in keep))
        return len(recs) - len(keep)

    # checkpoints
    def checkpoints(self) -> list[dict]:
        """Complete checkpoints (with COMPLETE marker and engine_state.json), oldest first."""
        out = []
        if not self.checkpoints_dir.is_dir():
            return out
        for stage_dir in self.checkpoints_dir.glob("stage-*"):
            for ck in stage_dir.glob("checkpoint-*"):
                state = read_json(ck / "engine_state.json")
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
            "has_final": (self.final_dir / "config.json").is_file(),
            "error": st.get("error"),
        }


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


def _self_started() -> float:
    return psutil.Process(os.getpid()).create_time()


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


# ------------------------------------------------------------------------------------------------
# Live store: what pages poll. One lock; snapshots are copies.
# ------------------------------------------------------------------------------------------------
class RunStore:
    def __init__(self):
        self._lock = threading.Lock()
        self.reset(None)

    def reset(self, run: RunDir | None, metrics=None, events=None, memory=None, step=None):
        with self._lock:
            self.run_id = run.id if run else None
            self.metrics: list[dict] = list(metrics or [])
            self.events: list[dict] = list(events or [])
            self.memory: list[dict] = list(memory or [])
            self.latest_step: dict | None = step
            self.status: dict = {"status": "idle"} if run is None else (run.read_status() or {})
            self.version = 0

    def add_metric(self, rec):
        with self._lock:
            self.metrics.append(rec)
            self.version += 1

    def add_event(self, ev):
        with self._lock:
            self.events.append(ev)
            self.version += 1

    def add_memory(self, sample):
        with self._lock:
            self.memory.append(sample)
            if len(self.memory) > 20000:  # keep charts light on very long runs: thin the oldest half
                self.memory = self.memory[:10000:2] + self.memory[10000:]

    def set_step(self, step):
        with self._lock:
            self.latest_step = step
            self.version += 1

    def update_status(self, **fields):
        with self._lock:
            self.status.update(fields)
            self.version += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "run_id": self.run_id,
                "status": dict(self.status),
                "metrics": list(self.metrics),
                "events": list(self.events),
                "memory": list(self.memory),
                "latest_step": self.latest_step,
                "version": self.version,
            }


class MemorySampler:
    """Samples this process's RSS every `interval` s (generation included) into a callback."""

    def __init__(self, on_sample, interval: float = 0.5):
        self.on_sample, self.interval = on_sample, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self.peak = 0

    def start(self):
        self._thread.start()
        return self

    def _loop(self):
        proc = psutil.Process(os.getpid())
        while not self._stop.is_set():
            rss = proc.memory_info().rss
            self.peak = max(self.peak, rss)
            try:
                self.on_sample({"time": time.time(), "rss_mb": rss / 2**20})
            except Exception:
                pass
            self._stop.wait(self.interval)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=2)


# ------------------------------------------------------------------------------------------------
# The manager: one training job per server (a lock file guards it across processes too)
# ------------------------------------------------------------------------------------------------
class RunInProgressError(RuntimeError):
    pass


class _TrainLock:
    """An exclusive lock file: held while a training job runs in this process."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = None

    def acquire(self) -> bool:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            return False
        self.fh = fh
        return True

    def release(self):
        if self.fh is not None:
            import fcntl

            with contextlib.suppress(OSError):
                fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None


class _JobReporter:
    """What the engine talks to: writes to the run folder and the live store."""

    def __init__(self, run: RunDir, store: RunStore, stop_event: threading.Event):
        self.run, self.store, self.stop_event = run, store, stop_event

    def event(self, kind: str, **data):
        ev = self.run.append_event(kind, **data)
        self.store.add_event(ev)

    def metrics(self, rec: dict):
        self.run.append_metric(rec)
        self.store.add_metric(rec)

    def step(self, snapshot: dict):
        atomic_write_json(self.run.step_path, snapshot)
        self.store.set_step(snapshot)

    def status(self, **fields):
        st = self.run.write_status(**fields)
        self.store.update_status(**st)

    def should_stop(self) -> bool:
        return self.stop_event.is_set()


class RunManager:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root else runs_root()
        self.store = RunStore()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._run: RunDir | None = None
        self._file_lock = _TrainLock(self.root / ".train.lock")

    # ---- state --------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def current_run(self) -> RunDir | None:
        return self._run

    def snapshot(self) -> dict:
        snap = self.store.snapshot()
        snap["active"] = self.active
        return snap

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self, cfg: Config, before_launch=None) -> RunDir:
        """Create a run folder for `cfg` and train in a background thread (`before_launch(run)` runs first)."""
        cfg.validate()
        with self._lock:
            self._claim()
            try:
                run = RunDir.create(self.root, cfg)
                if before_launch is not None:
                    before_launch(run)
            except Exception:
                self._file_lock.release()
                raise
            self._launch(run, resume=False)
            return run

    def resume(self, run_id: str, before_launch=None) -> RunDir:
        run_id = validate_run_id(run_id)
        run = RunDir(self.root / run_id)
        if not run.config_path.is_file():
            raise ValueError(f"no run '{run_id}' under {self.root}.")
        with self._lock:
            status = run.effective_status()
            if status == "completed":
                raise ValueError(f"run '{run_id}' already completed; start a new run instead.")
            if run.latest_checkpoint() is None:
                raise ValueError(f"run '{run_id}' has no complete checkpoint to resume from; start it again.")
            self._claim()
            try:
                if before_launch is not None:
                    before_launch(run)
            except Exception:
                self._file_lock.release()
                raise
            self._launch(run, resume=True)
            return run

    def _claim(self):
        if self.active:
            raise RunInProgressError(f"a run is in progress ({self._run.id if self._run else '?'}); stop it or wait.")
        if not self._file_lock.acquire():
            raise RunInProgressError("a run is in progress in another process on this server; wait for it to finish.")

    def _launch(self, run: RunDir, resume: bool):
        self._stop = threading.Event()
        self._run = run
        self.store.reset(
            run,
            metrics=run.metrics() if resume else [],
            events=run.events() if resume else [],
            memory=run.memory() if resume else [],
            step=read_json(run.step_path) if resume else None,
        )
        run.write_status(
            status="running",
            pid=os.getpid(),
            pid_started=_self_started(),
            error=None,
            **({} if resume else {"started": time.time()}),
        )
        self.store.update_status(**run.read_status())
        self._thread = threading.Thread(
            target=self._work, args=(run, resume, self._stop), name=f"train-{run.id}", daemon=True
        )
        self._thread.start()

    def _work(self, run: RunDir, resume: bool, stop: threading.Event):
        from .engine import train

        reporter = _JobReporter(run, self.store, stop)

        def on_mem(sample):
            self.store.add_memory(sample)
            with contextlib.suppress(OSError):
                append_jsonl(run.memory_path, sample)

        sampler = MemorySampler(on_mem).start()
        try:
            final = train(run.config(), run, reporter, resume=resume)
            reporter.status(status=final, ended=time.time(), peak_rss_mb=sampler.peak / 2**20)
        except BaseException as e:  # noqa: BLE001 - a crash marks the run failed, the app keeps serving
            msg = f"{type(e).__name__}: {e}"
            reporter.event("error", message=msg, traceback=traceback.format_exc()[-4000:])
            reporter.status(status="failed", error=msg, ended=time.time(), peak_rss_mb=sampler.peak / 2**20)
        finally:
            sampler.stop()
            self._file_lock.release()

    def stop(self) -> bool:
        """Ask the running job to stop at the next step boundary (it saves a checkpoint). False if none runs."""
        if not self.active:
            return False
        if not self._stop.is_set():
            self._stop.set()
            if self._run is not None:
                self._run.write_status(status="stopping")
                self.store.update_status(status="stopping")
        return True

    def wait(self, timeout: float | None = None) -> bool:
        t = self._thread
        if t is not None:
            t.join(timeout)
        return not self.active

    # ---- history ------------------------------------------------------------------------------
    def runs(self) -> list[RunDir]:
        return list_runs(self.root)

    def get(self, run_id: str) -> RunDir:
        run_id = validate_run_id(run_id)
        run = RunDir(self.root / run_id)
        if not run.config_path.is_file():
            raise ValueError(f"no run '{run_id}'.")
        return run

    def delete(self, run_id: str) -> None:
        run = self.get(run_id)
        if self.active and self._run is not None and self._run.id == run.id:
            raise RunInProgressError("this run is in progress; stop it before deleting it.")
        if run.effective_status() in ACTIVE:
            raise RunInProgressError("this run is in progress in another process.")
        shutil.rmtree(run.path)
