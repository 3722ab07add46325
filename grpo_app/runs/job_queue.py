"""A small background job queue for evaluations (no Gradio import).

One worker runs jobs one at a time, in order; at most `max_pending` wait behind it, so a classroom
of browsers cannot stack up hours of CPU work. A job is a function
`fn(report, should_stop) -> result`: it calls `report(**progress)` as it goes and checks
`should_stop()` between batches. `should_stop()` turns true when someone cancels the job, or when
nobody has asked about it for `idle_timeout` seconds (its page was closed) — so an abandoned
evaluation ends at its next batch instead of running forever. Pages keep a job alive by polling
`get(job_id)`. Two requests with the same `key` share one job.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
FINISHED = (DONE, FAILED, CANCELLED)


class QueueFullError(RuntimeError):
    pass


@dataclass(eq=False)
class Job:
    id: str
    label: str
    fn: Callable[..., Any]
    key: str | None = None
    status: str = QUEUED
    progress: dict = field(default_factory=dict)
    result: Any = None
    error: str | None = None
    created: float = field(default_factory=time.time)
    started: float | None = None
    ended: float | None = None
    last_seen: float = field(default_factory=time.monotonic)
    watchers: set = field(default_factory=set)
    cancel_reason: str | None = None
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    def touch(self, watcher: str | None = None) -> None:
        self.last_seen = time.monotonic()
        if watcher:
            self.watchers.add(watcher)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def cancel(self, reason: str = "cancelled") -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self._cancel.set()

    def snapshot(self) -> dict:
        return {
            "id": self.id,
            "label": self.label,
            "status": self.status,
            "progress": dict(self.progress),
            "error": self.error,
            "created": self.created,
            "started": self.started,
            "ended": self.ended,
            "cancel_reason": self.cancel_reason,
        }


class JobQueue:
    def __init__(self, max_pending: int = 3, idle_timeout: float = 60.0, keep_finished: int = 50, name: str = "jobs"):
        self.max_pending = max_pending
        self.idle_timeout = idle_timeout
        self.name = name
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._jobs: collections.OrderedDict[str, Job] = collections.OrderedDict()
        self._keep = keep_finished
        self._running: Job | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._seq = itertools.count(1)

    # ---- submitting and watching ---------------------------------------------------------------
    def submit(
        self, fn: Callable[..., Any], label: str = "", key: str | None = None, watcher: str | None = None
    ) -> Job:
        """Queue `fn`; returns its Job (an existing one when a job with the same key is waiting or running)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the job queue is shut down")
            if key is not None:
                for job in self._active_jobs():
                    if job.key == key and not job._cancel.is_set():
                        job.touch(watcher)
                        return job
            if len(self._queue) >= self.max_pending:
                raise QueueFullError(
                    f"{len(self._queue)} jobs are already waiting (the limit is {self.max_pending}); "
                    "try again when one has finished."
                )
            job = Job(id=f"{next(self._seq)}-{uuid.uuid4().hex[:8]}", label=label, fn=fn, key=key)
            job.touch(watcher)
            self._queue.append(job)
            self._jobs[job.id] = job
            self._trim()
            self._ensure_worker()
            self._cond.notify_all()
            return job

    def get(self, job_id: str, touch: bool = True, watcher: str | None = None) -> Job | None:
        with self._cond:
            job = self._jobs.get(job_id or "")
            if job is not None and touch:
                job.touch(watcher)
            return job

    def position(self, job: Job) -> int:
        """0 while running or finished; k when k-1 jobs wait before it (1 = next)."""
        with self._cond:
            try:
                return list(self._queue).index(job) + 1
            except ValueError:
                return 0

    def cancel(self, job_id: str, reason: str = "cancelled") -> bool:
        with self._cond:
            job = self._jobs.get(job_id or "")
            if job is None or job.finished:
                return False
            job.cancel(reason)
            if job in self._queue:
                self._queue.remove(job)
                self._finish(job, CANCELLED)
            return True

    def release(self, watcher: str) -> list[str]:
        """A page went away: cancel jobs that nobody else watches. Returns the cancelled ids."""
        out = []
        with self._cond:
            for job in self._active_jobs():
                if watcher in job.watchers:
                    job.watchers.discard(watcher)
                    if not job.watchers:
                        out.append(job.id)
        for job_id in out:
            self.cancel(job_id, "its page was closed")
        return out

    def shutdown(self, wait: float | None = 5.0) -> None:
        with self._cond:
            self._closed = True
            for job in list(self._queue):
                job.cancel("server shutting down")
                self._finish(job, CANCELLED)
            self._queue.clear()
            if self._running is not None:
                self._running.cancel("server shutting down")
            self._cond.notify_all()
        if self._thread is not None and wait:
            self._thread.join(wait)

    # ---- internals -------------------------------------------------------------------------------
    def _active_jobs(self) -> list[Job]:
        return ([self._running] if self._running is not None else []) + list(self._queue)

    def _abandoned(self, job: Job) -> bool:
        return self.idle_timeout > 0 and time.monotonic() - job.last_seen > self.idle_timeout

    def _should_stop(self, job: Job) -> bool:
        if job._cancel.is_set():
            return True
        if self._abandoned(job):
            job.cancel(f"nobody watched it for {self.idle_timeout:.0f} s (its page was closed)")
            return True
        return False

    def _trim(self) -> None:
        finished = [j for j in self._jobs.values() if j.finished]
        for job in finished[: max(0, len(finished) - self._keep)]:
            self._jobs.pop(job.id, None)

    def _finish(self, job: Job, status: str, error: str | None = None) -> None:
        # The status last: another thread that sees a finished status must see its error and end time.
        job.error, job.ended = error, time.time()
        job.status = status

    def _ensure_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name=f"{self.name}-worker", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait(timeout=1.0)
                if self._closed:
                    return
                job = self._queue.popleft()
                if self._should_stop(job):  # cancelled or abandoned while waiting
                    self._finish(job, CANCELLED)
                    continue
                self._running = job
                job.status, job.started = RUNNING, time.time()
            self._run(job)
            with self._cond:
                self._running = None
                self._trim()
                self._cond.notify_all()

    def _run(self, job: Job) -> None:
        def report(**progress):
            job.progress.update(progress)

        try:
            result = job.fn(report, lambda: self._should_stop(job))
        except InterruptedError:
            self._finish(job, CANCELLED)
            return
        except BaseException as e:  # noqa: BLE001 - a failing job must not kill the worker
            if job._cancel.is_set():
                self._finish(job, CANCELLED)
            else:
                # Kept for the server's side (never rendered); written before the status so that a
                # watcher who sees "failed" also sees it.
                job.progress["traceback"] = traceback.format_exc()[-3000:]
                self._finish(job, FAILED, f"{type(e).__name__}: {e}")
            return
        if job._cancel.is_set() and result is None:
            self._finish(job, CANCELLED)
            return
        job.result = result
        self._finish(job, DONE)
