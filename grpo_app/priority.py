"""The web server's threads yield the CPU to the training (Linux): a page's request must not slow a step.

Why: on 2 cores the training's two torch threads work in lock-step (each matmul is split between them and
waits for both halves). A request answered at the same priority takes a core from one of them, and the other
then waits too: measured in docs/performance.md, each request a second cost training 1.1-2.0% of its time,
two to three times the CPU the requests used. At a lower priority (a higher nice value) the kernel runs the
server's threads mostly when a training thread is not using its core.

How: Linux keeps a nice value per thread, and a new thread or process inherits its creator's. The app, once
its server threads are running, raises the nice value of every thread of its process but two: the main thread
and one *launcher* thread made before that (`Launcher`), from which `RunManager` starts every training (child
process or thread), so the training keeps the priority the app was started with. A thread the server makes later
(a request's worker thread, a Compare or export job) inherits the lower priority from the thread that makes it.
Raising a nice value needs no privilege; lowering it back would, so nothing here ever does.

Elsewhere (macOS, Windows: no per-thread nice through /proc) this does nothing and says so in the log.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

TASKS = Path("/proc/self/task")


class Launcher:
    """One thread, made now at the caller's priority, that runs the callables given to `run` and returns their
    result (or raises their exception). Threads and processes started in it have that priority."""

    def __init__(self):
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="launcher")
        self.native_id = self._pool.submit(threading.get_native_id).result()  # the thread exists from here on

    def run(self, fn, *args, **kwargs):
        return self._pool.submit(fn, *args, **kwargs).result()


def thread_nice(tid: int | None = None) -> int:
    """The nice value of a thread of this process (the calling thread by default)."""
    return os.getpriority(os.PRIO_PROCESS, tid or threading.get_native_id())


def lower_threads(nice: int, keep: set[int]) -> int | None:
    """Raise every thread of this process but `keep` (native ids) to at least `nice`. Returns how many threads
    were changed, or None where threads have no nice value of their own (not Linux) or nice <= 0."""
    if nice <= 0:
        return None
    if not TASKS.is_dir():
        log.info("server priority: per-thread nice values need Linux; left as is")
        return None
    changed = 0
    for entry in TASKS.iterdir():
        try:
            tid = int(entry.name)
            if tid in keep:
                continue
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except (ValueError, ProcessLookupError, PermissionError, OSError):  # a thread that just ended
            continue
    return changed


def nice_from_env(default: int = 10) -> int:
    """GRPO_APP_SERVER_NICE: the nice value the server's threads are raised to (0 = leave them as started)."""
    raw = os.environ.get("GRPO_APP_SERVER_NICE", "").strip()
    if not raw:
        return default
    try:
        return max(0, min(19, int(raw)))
    except ValueError:
        log.warning("GRPO_APP_SERVER_NICE=%r is not a whole number; using %d", raw, default)
        return default
