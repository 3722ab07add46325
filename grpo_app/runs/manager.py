"""The RunManager: the one training job of a server, its live store, its memory sampler and its lock.

It sits above the engine: it creates or reopens a run folder (runs.py), trains through `engine.train`,
and after a completed training starts the base-vs-trained evaluation (`evaluation.evaluate_run_vs_base`).
What the engine reports goes to the run folder and to a `RunStore` that pages poll; the UI and the CLI
read this manager, never the engine's internals.

Where the job runs:
- `process=False` (the CLI, the tests): in a background thread of this process.
- `process=True` (the web app): in a child process, `python -m grpo_app.runs.train_child`. A crash of the
  training, or its being killed for memory, then leaves the server up (the run is marked failed), the
  training's memory goes back to the system when the run ends, and the server's answers to pages never
  hold the interpreter lock the training loop needs. (That last was expected to remove the slowdown that
  watching pages cause; measured side by side, it does not: the pages' requests cost CPU on the same two
  cores either way, docs/performance.md.) The child runs the same `run_job` with the same reporter; its reporter's live
  store is a pipe (`PipeStore`) whose lines a thread here applies to this manager's `RunStore`. Stop is a
  line on the child's stdin; the end of stdin (this server gone, even by kill -9) is a stop too, so an
  orphaned child ends at its next check and keeps its last complete step. The child holds the runs
  folder's lock file as long as it lives (the descriptor is passed to it), so no second server can start
  a run beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import psutil

from grpo_app.core.config import Config
from grpo_app.core.fileio import _json_default, append_jsonl, atomic_write_json, hide_server_paths
from grpo_app.core.run_folder import ACTIVE, RunDir, list_runs, resolve_run, runs_root
from grpo_app.training.estimate import check_step


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
        self.doing = "starting"  # what a stop asked now waits for (engine `activity`); memory only, no I/O

    def event(self, kind: str, **data):
        ev = self.run.append_event(kind, **data)
        self.store.add_event(ev)

    def metrics(self, rec: dict):
        self.run.append_metric(rec)
        self.store.add_metric(rec)

    def step(self, snapshot: dict):
        atomic_write_json(self.run.step_path, snapshot)
        with contextlib.suppress(OSError):  # the history is a view: a full disk must not stop training here
            self.run.append_step(snapshot)
        self.store.set_step(snapshot)

    def status(self, **fields):
        st = self.run.write_status(**fields)
        self.store.update_status(**st)

    def should_stop(self) -> bool:
        return self.stop_event.is_set()

    def activity(self, text: str) -> None:
        self.doing = text
        if self.stop_event.is_set():  # a stop is waiting: the page shows what for, as it changes
            self.status(phase=f"stopping: {text}")

    def request_stop(self, why: str | None = None) -> None:
        """Ask the job to stop (once): the engine checks `should_stop` inside the step in progress. The run's
        status says what the stop waits for, and the run log records the request."""
        if self.stop_event.is_set():
            return
        doing = self.doing
        self.stop_event.set()
        self.status(status="stopping", phase=f"stopping: {doing}", stop_asked=time.time())
        self.event("stop_requested", waiting_for=doing, **({"why": why} if why else {}))


def run_job(run: RunDir, resume: bool, reporter: _JobReporter, observers=()) -> None:
    """Train `run` (and evaluate it against its base when it completes), reporting through `reporter`; the
    memory chart samples this process's RSS. A crash marks the run failed; nothing is raised.
    `observers`: `engine.Observer`s handed to `engine.train` (benches)."""
    from grpo_app.training.engine import train

    def on_mem(sample):
        reporter.store.add_memory(sample)
        with contextlib.suppress(OSError):
            append_jsonl(run.memory_path, sample)

    sampler = MemorySampler(on_mem).start()
    t0 = time.time()
    try:
        cfg = run.config()
        final = train(cfg, run, reporter, resume=resume, observers=observers)
        if final == "completed" and run.has_final_model():
            _evaluate(run, cfg, reporter)
            reporter.event("finished", seconds=round(time.time() - t0, 1))
        reporter.status(status=final, ended=time.time(), peak_rss_mb=sampler.peak / 2**20)
    except BaseException as e:  # noqa: BLE001 - a crash marks the run failed, the app keeps serving
        msg = failure_message(e, run.path)  # every page reads it (the traceback stays on disk)
        reporter.event("error", message=msg, traceback=traceback.format_exc()[-4000:])
        reporter.status(status="failed", error=msg, ended=time.time(), peak_rss_mb=sampler.peak / 2**20)
    finally:
        sampler.stop()


DISK_FULL_BELOW = 64 * 2**20  # free bytes under which a failed write is put down to a full disk


def failure_message(e: BaseException, where: Path) -> str:
    """What every page shows of a crashed run: the error in one line, without server paths. A full disk says
    so and how to go on: torch reports a checkpoint cut short by it as a RuntimeError ('unexpected pos ...',
    'PytorchStreamWriter failed writing file'), so besides ENOSPC the free space where the run is written counts."""
    import errno

    msg = hide_server_paths(f"{type(e).__name__}: {e}")
    full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
    if not full and isinstance(e, (OSError, RuntimeError)):
        with contextlib.suppress(OSError):
            full = shutil.disk_usage(where).free < DISK_FULL_BELOW
    if full:
        return (f"the disk is full: the run could not write its files ({msg[:200]}). Free some space (Runs deletes "
                f"old runs) and resume the run: it goes on from its last complete checkpoint.")
    return msg


def _evaluate(run: RunDir, cfg: Config, reporter) -> None:
    """The after-training comparison of the trained model with its base (`run.eval_n` GSM8K problems).
    A stop ends it early: training is complete and its model saved; the Compare tab can score it later."""
    if cfg.run.eval_n <= 0:
        return
    from grpo_app.evaluation.scoring import evaluate_run_vs_base

    reporter.status(phase="evaluating base vs trained")
    reporter.activity("ending the base-vs-trained evaluation (training is complete and its model is saved)")
    try:
        res = evaluate_run_vs_base(run, n=cfg.run.eval_n, should_stop=reporter.should_stop)
    except InterruptedError:
        reporter.event("eval_stopped", n=cfg.run.eval_n)
        return
    reporter.event("eval_done", **{key: res[key] for key in ("n", "base_accuracy", "trained_accuracy", "p_value")})


# ------------------------------------------------------------------------------------------------
# A job in a child process: the child's live store is a pipe; a thread here applies its lines
# ------------------------------------------------------------------------------------------------
_STORE_CALLS = ("add_metric", "add_event", "add_memory", "set_step", "update_status")


class PipeStore:
    """The child's side of the live store: each call is one JSON line on the pipe to the server. Once the
    server is gone the lines are dropped (the run folder still gets every record)."""

    def __init__(self, out):
        self.out, self._lock, self.closed = out, threading.Lock(), False

    def _send(self, call: str, value) -> None:
        with self._lock:
            if self.closed:
                return
            try:
                self.out.write(json.dumps({"call": call, "value": value}, default=_json_default) + "\n")
                self.out.flush()
            except (OSError, ValueError):
                self.closed = True

    def __getattr__(self, name):
        if name in _STORE_CALLS:
            return lambda value=None, **fields: self._send(name, fields if name == "update_status" else value)
        raise AttributeError(name)


def apply_store_line(store: RunStore, line: str) -> None:
    """One line from `PipeStore` applied to `store`; a line that is not one of its calls is ignored."""
    try:
        msg = json.loads(line)
        call, value = msg["call"], msg["value"]
    except (ValueError, KeyError, TypeError):
        return
    if call == "update_status" and isinstance(value, dict):
        store.update_status(**value)
    elif call in _STORE_CALLS and call != "update_status":
        getattr(store, call)(value)


class RunManager:
    def __init__(self, root: str | Path | None = None, process: bool = False):
        self.root = Path(root) if root else runs_root()
        self.process = process  # train in a child process (see the module's docstring)
        self._child: subprocess.Popen | None = None
        self._stop_seen = threading.Event()
        self.store = RunStore()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._run: RunDir | None = None
        self._reporter: _JobReporter | None = None
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
    def start(self, cfg: Config, before_launch=None, observers=()) -> RunDir:
        """Create a run folder for `cfg` and train in a background thread (`before_launch(run)` runs first).
        Raises ConfigError when the settings are invalid, or when one step would not fit this machine's memory
        or the server's step-time limit (estimate.check_step, with the estimate in the message).
        `observers` (`engine.Observer`, benches): they see the model, so only a manager that trains in this
        process takes them."""
        if observers and self.process:
            raise ValueError("observers see the live model: they need a manager that trains in this process.")
        cfg.validate()
        check_step(cfg)
        with self._lock:
            self._claim()
            try:
                run = RunDir.create(self.root, cfg)
                if before_launch is not None:
                    before_launch(run)
            except Exception:
                self._file_lock.release()
                raise
            self._launch(run, resume=False, observers=observers)
            return run

    def resume(self, run_id: str, before_launch=None) -> RunDir:
        run = self.get(run_id)
        run_id = run.id
        with self._lock:
            status = run.effective_status()
            if status == "damaged":
                raise ValueError(f"run '{run_id}' is damaged ({run.damage()}); it cannot be resumed.")
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
        if self.active and self.process and self.store.status.get("status") not in ACTIVE:
            self._thread.join(30)  # the child has ended its run and is exiting: wait for it, not a refusal
        if self.active:
            raise RunInProgressError(f"a run is in progress ({self._run.id if self._run else '?'}); stop it or wait.")
        if not self._file_lock.acquire():
            raise RunInProgressError("a run is in progress in another process on this server; wait for it to finish.")

    def _launch(self, run: RunDir, resume: bool, observers=()):
        self._stop = threading.Event()
        self._run = run
        self.store.reset(
            run,
            metrics=run.metrics() if resume else [],
            events=run.events() if resume else [],
            memory=run.memory() if resume else [],
            step=run.latest_step() if resume else None,
        )
        run.write_status(
            status="running",
            pid=os.getpid(),
            pid_started=psutil.Process(os.getpid()).create_time(),
            error=None,
            **({} if resume else {"started": time.time()}),
        )
        self.store.update_status(**run.read_status())
        if self.process:
            self._launch_child(run, resume)
            return
        self._reporter = _JobReporter(run, self.store, self._stop)
        self._thread = threading.Thread(
            target=self._work, args=(run, resume, self._reporter, observers), name=f"train-{run.id}", daemon=True
        )
        self._thread.start()

    def _work(self, run: RunDir, resume: bool, reporter: _JobReporter, observers=()):
        try:
            run_job(run, resume, reporter, observers)
        finally:
            self._file_lock.release()

    def _launch_child(self, run: RunDir, resume: bool):
        read_fd, write_fd = os.pipe()
        package_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p))
        cmd = [sys.executable, "-m", "grpo_app.runs.train_child", str(run.path), "--report-fd", str(write_fd)]
        try:
            proc = subprocess.Popen(
                cmd + (["--resume"] if resume else []),
                stdin=subprocess.PIPE,
                env=env,
                pass_fds=(write_fd, self._file_lock.fh.fileno()),  # the child holds the lock as long as it lives
                text=True,
            )
        except BaseException:
            os.close(read_fd)
            self._file_lock.release()
            raise
        finally:
            os.close(write_fd)
        self._child = proc
        self._stop_seen = threading.Event()
        self._thread = threading.Thread(
            target=self._follow_child, args=(run, proc, read_fd), name=f"train-{run.id}", daemon=True
        )
        self._thread.start()

    def _follow_child(self, run: RunDir, proc: subprocess.Popen, read_fd: int):
        try:
            with open(read_fd, encoding="utf-8", errors="replace") as lines:
                for line in lines:
                    apply_store_line(self.store, line)
                    if '"stop_asked"' in line:
                        self._stop_seen.set()
            code = proc.wait()
            if run.read_status().get("status") in ACTIVE:  # the child died without ending its run
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                msg = f"the training process ended unexpectedly ({how}); resume continues from the last complete step."
                self.store.add_event(run.append_event("error", message=msg))
                self.store.update_status(**run.write_status(status="failed", error=msg, ended=time.time()))
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            self._stop_seen.set()
            self._file_lock.release()

    def stop(self) -> bool:
        """Ask the running job to stop (in a single process: within the step in progress, see engine.py).
        Records what the stop waits for (a child process records it itself; this waits up to 2 s for that
        to arrive, so the answer can say it). False if no job runs."""
        if not self.active:
            return False
        if self.process:
            if not self._stop.is_set():
                self._stop.set()
                with contextlib.suppress(OSError, ValueError):
                    self._child.stdin.write("stop\n")
                    self._child.stdin.flush()
            self._stop_seen.wait(2.0)
        elif self._reporter is not None:
            self._reporter.request_stop()
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
        """The run `run_id` of this manager's folder (`runs.resolve_run`: symlinked folders are refused)."""
        return resolve_run(self.root, run_id)

    def delete(self, run_id: str) -> None:
        run = self.get(run_id)
        if self.active and self._run is not None and self._run.id == run.id:
            raise RunInProgressError("this run is in progress; stop it before deleting it.")
        if run.effective_status() in ACTIVE:
            raise RunInProgressError("this run is in progress in another process.")
        shutil.rmtree(run.path)
