"""The evaluation queue: one job at a time, a bounded wait list, shared by key, cancelled when abandoned."""

import threading
import time

import pytest

from grpo_app.runs.job_queue import CANCELLED, DONE, FAILED, RUNNING, JobQueue, QueueFullError

from .conftest import wait_until


def wait(pred, timeout=30):
    return wait_until(pred, timeout, every=0.02)


def blocking_job(gate: threading.Event, result="ok", steps=None):
    """A job that reports progress and waits for `gate`, checking should_stop like an evaluation does."""

    def fn(report, should_stop):
        i = 0
        while not gate.is_set():
            if should_stop():
                raise InterruptedError
            i += 1
            report(i=i)
            if steps is not None:
                steps.append(i)
            time.sleep(0.01)
        return result

    return fn


@pytest.fixture
def q():
    queue = JobQueue(max_pending=2, idle_timeout=0)
    yield queue
    queue.shutdown(wait=2)


def test_runs_jobs_in_order_and_reports_progress(q):
    order = []

    def make(name):
        def fn(report, should_stop):
            report(phase=name)
            order.append(name)
            return name.upper()

        return fn

    jobs = [q.submit(make("a")), q.submit(make("b"))]
    assert wait(lambda: all(j.finished for j in jobs))
    assert order == ["a", "b"] and [j.result for j in jobs] == ["A", "B"]
    assert jobs[0].progress == {"phase": "a"} and jobs[0].status == DONE


def test_bounded_wait_list_and_positions(q):
    gate = threading.Event()
    running = q.submit(blocking_job(gate))
    assert wait(lambda: running.status == RUNNING)
    second, third = q.submit(blocking_job(gate)), q.submit(blocking_job(gate))
    assert (q.position(running), q.position(second), q.position(third)) == (0, 1, 2)
    with pytest.raises(QueueFullError, match="limit is 2"):
        q.submit(blocking_job(gate))
    gate.set()
    assert wait(lambda: third.finished) and third.status == DONE


def test_same_key_shares_one_job(q):
    gate = threading.Event()
    a = q.submit(blocking_job(gate), key="k", watcher="page1")
    b = q.submit(blocking_job(gate), key="k", watcher="page2")
    assert a is b and a.watchers == {"page1", "page2"}
    gate.set()
    assert wait(lambda: a.finished)
    c = q.submit(blocking_job(gate), key="k")  # finished jobs are not reused (results are cached elsewhere)
    assert c is not a


def test_cancel_running_and_queued(q):
    gate = threading.Event()
    running = q.submit(blocking_job(gate))
    queued = q.submit(blocking_job(gate))
    assert wait(lambda: running.status == RUNNING)
    assert q.cancel(queued.id) and queued.status == CANCELLED
    assert q.cancel(running.id)
    assert wait(lambda: running.finished) and running.status == CANCELLED
    assert not q.cancel(running.id)  # already finished
    assert not q.cancel("no-such-job")


def test_failure_is_recorded_and_the_worker_survives(q):
    def bad(report, should_stop):
        raise ValueError("broken model")

    job = q.submit(bad)
    assert wait(lambda: job.finished)
    assert job.status == FAILED and job.error == "ValueError: broken model" and "traceback" in job.progress
    ok = q.submit(lambda report, should_stop: 1)
    assert wait(lambda: ok.finished) and ok.result == 1


def test_a_failed_job_has_its_traceback_before_anyone_can_see_it_failed(q, monkeypatch):
    """A watcher polls `finished` from another thread: the traceback must be written before the status
    flips, or the watcher can read "failed" with no traceback (seen once in CI under load)."""
    import grpo_app.runs.job_queue as jq

    seen = []
    real = jq.traceback.format_exc

    def format_exc(*a, **k):
        seen.append(job.status)
        return real(*a, **k)

    monkeypatch.setattr(jq.traceback, "format_exc", format_exc)

    def bad(report, should_stop):
        raise ValueError("broken model")

    job = q.submit(bad)
    assert wait(lambda: job.finished)
    assert seen == [RUNNING] and job.status == FAILED and "traceback" in job.progress


def test_abandoned_job_cancels_itself():
    queue = JobQueue(idle_timeout=0.3)
    try:
        gate = threading.Event()
        steps = []
        job = queue.submit(blocking_job(gate, steps=steps))
        assert wait(lambda: job.finished, timeout=10)  # nobody polls get(): it stops by itself
        assert job.status == CANCELLED and "nobody watched" in job.cancel_reason
        watched = queue.submit(blocking_job(gate))
        t_end = time.time() + 1.0
        while time.time() < t_end:  # a page polling keeps it alive past the idle timeout
            queue.get(watched.id)
            time.sleep(0.05)
        assert watched.status == RUNNING
        gate.set()
        assert wait(lambda: watched.finished) and watched.status == DONE
    finally:
        queue.shutdown(wait=2)


def test_release_cancels_only_jobs_nobody_else_watches(q):
    gate = threading.Event()
    shared = q.submit(blocking_job(gate), key="s", watcher="p1")
    q.submit(blocking_job(gate), key="s", watcher="p2")
    own = q.submit(blocking_job(gate), key="o", watcher="p1")
    assert q.release("p1") == [own.id]
    assert own.status == CANCELLED and not shared._cancel.is_set()
    gate.set()
    assert wait(lambda: shared.finished) and shared.status == DONE


def test_shutdown_cancels_everything():
    queue = JobQueue(max_pending=5, idle_timeout=0)
    gate = threading.Event()
    running = queue.submit(blocking_job(gate))
    waiting = queue.submit(blocking_job(gate))
    assert wait(lambda: running.status == RUNNING)
    queue.shutdown(wait=5)
    assert waiting.status == CANCELLED and running.status == CANCELLED
    with pytest.raises(RuntimeError):
        queue.submit(blocking_job(gate))
