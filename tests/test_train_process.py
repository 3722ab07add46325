"""Training in a child process (`RunManager(process=True)`, the web app's way): the live store fed through
the pipe, stop, the child's death, the server's disappearance, and the lock the child holds."""

import os
import signal
import threading
import time

import numpy as np
import pytest

from grpo_app.core.config import load_config
from grpo_app.runs.manager import PipeStore, RunInProgressError, RunManager, RunStore, apply_store_line

from .conftest import wait_until


def cfg_for(runs, *extra):
    return load_config("tests/configs/tiny.yaml", [f"run.output_dir={runs}", *extra])



def events(run):
    return [e["event"] for e in run.events()]


def test_a_run_in_a_child_process_feeds_the_live_store_and_its_folder(runs_dir):
    mgr = RunManager(runs_dir, process=True)
    run = mgr.start(cfg_for(runs_dir))
    assert mgr.active
    assert mgr.wait(300)
    st = run.read_status()
    assert st["status"] == "completed", st
    assert st["pid"] not in (None, os.getpid()) and st["pid"] == mgr._child.pid  # "running" meant the child
    assert mgr._child.returncode == 0
    snap = mgr.snapshot()
    assert snap["status"]["status"] == "completed" and not snap["active"]
    assert [m["step"] for m in snap["metrics"]] == [m["step"] for m in run.metrics()] == [1, 2, 3, 4]
    assert snap["events"] == run.events() and events(run)[-1] == "finished"
    assert snap["latest_step"] == run.latest_step() and snap["latest_step"]["step"] == 4
    assert snap["memory"] and all(s["rss_mb"] > 50 for s in snap["memory"])  # the child's RSS, sampled there
    assert snap["status"]["peak_rss_mb"] >= max(s["rss_mb"] for s in snap["memory"]) - 1
    again = mgr.start(cfg_for(runs_dir))  # the lock was given back
    assert mgr.wait(300) and again.read_status()["status"] == "completed"


def test_stop_reaches_the_child_which_keeps_its_last_complete_step(runs_dir):
    mgr = RunManager(runs_dir, process=True)
    run = mgr.start(cfg_for(runs_dir, "stages[0].steps=500"))
    assert wait_until(lambda: len(mgr.snapshot()["metrics"]) >= 1)
    assert mgr.stop()
    st = mgr.snapshot()["status"]  # the child's answer arrived before stop() returned
    assert st["status"] == "stopping" and st["phase"].startswith("stopping: ") and st["stop_asked"]
    assert wait_until(lambda: mgr.snapshot()["status"]["status"] == "stopped", 120)
    assert run.read_status()["status"] == "stopped"
    assert "stop_requested" in events(run)
    assert run.latest_checkpoint() is not None
    steps = [m["step"] for m in run.metrics()]
    assert steps and steps[-1] < 500
    resumed = mgr.resume(run.id)  # at once: a page shows "stopped" while the child may still be exiting
    assert wait_until(lambda: len(mgr.snapshot()["metrics"]) > len(steps))
    assert mgr.stop() and mgr.wait(120) and resumed.read_status()["status"] == "stopped"


def test_a_child_that_dies_marks_its_run_failed_and_frees_the_server(runs_dir):
    mgr = RunManager(runs_dir, process=True)
    run = mgr.start(cfg_for(runs_dir, "stages[0].steps=500"))
    assert wait_until(lambda: run.latest_checkpoint() is not None)
    mgr._child.send_signal(signal.SIGKILL)
    assert mgr.wait(60)
    st = run.read_status()
    assert st["status"] == "failed" and "signal 9" in st["error"], st
    assert mgr.snapshot()["status"]["status"] == "failed"
    assert events(run)[-1] == "error"
    assert run.latest_checkpoint() is not None  # Resume can continue from it
    resumed = mgr.resume(run.id)
    assert wait_until(lambda: len(mgr.snapshot()["metrics"]) >= 1)
    assert mgr.stop() and mgr.wait(120) and resumed.read_status()["status"] == "stopped"


def test_a_child_whose_server_is_gone_stops_by_itself_and_holds_the_lock_until_then(runs_dir):
    mgr = RunManager(runs_dir, process=True)
    run = mgr.start(cfg_for(runs_dir, "stages[0].steps=500"))
    assert wait_until(lambda: len(mgr.snapshot()["metrics"]) >= 1)
    other = RunManager(runs_dir)  # a second server on the same runs folder
    with pytest.raises(RunInProgressError, match="another process"):
        other.start(cfg_for(runs_dir))
    mgr._file_lock.fh.close()  # as if this server were gone (no unlock, its descriptor closed): the child's remains
    mgr._file_lock.fh = None
    with pytest.raises(RunInProgressError, match="another process"):
        other.start(cfg_for(runs_dir))
    mgr._child.stdin.close()  # the end of its stdin: what the child sees when the server dies
    assert mgr.wait(120)
    assert run.read_status()["status"] == "stopped"
    stop = [e for e in run.events() if e["event"] == "stop_requested"]
    assert len(stop) == 1 and "gone" in stop[0]["why"]
    assert other.start(cfg_for(runs_dir, "stages[0].steps=1", "stages[1].steps=1"))
    assert other.wait(300)


def test_the_pipe_carries_each_store_call_and_ignores_anything_else(tmp_path):
    path = tmp_path / "pipe.jsonl"
    with open(path, "w") as out:
        child = PipeStore(out)
        child.add_metric({"step": 1, "reward": float("nan"), "lr": np.float32(0.5)})  # as the run folder takes them
        child.add_event({"event": "stage_start"})
        child.add_memory({"time": 1.0, "rss_mb": 100.0})
        child.set_step({"step": 1, "groups": []})
        child.update_status(status="running", step=1)
    store = RunStore()
    for line in [*path.read_text().splitlines(), "not json", '{"call": "reset", "value": null}', '{"call": "add_metric"}',
                 '{"call": "update_status", "value": [1]}', "[]"]:
        apply_store_line(store, line)
    snap = store.snapshot()
    assert [m["step"] for m in snap["metrics"]] == [1] and snap["metrics"][0]["reward"] != snap["metrics"][0]["reward"]
    assert snap["metrics"][0]["lr"] == 0.5
    assert snap["events"] == [{"event": "stage_start"}] and snap["memory"] == [{"time": 1.0, "rss_mb": 100.0}]
    assert snap["latest_step"] == {"step": 1, "groups": []}
    assert snap["status"]["status"] == "running" and snap["status"]["step"] == 1
    with pytest.raises(AttributeError):
        child.reset()  # only the store calls cross the pipe
    closed = PipeStore(open(path, "w"))
    closed.out.close()
    closed.add_metric({"step": 2})  # the server is gone: dropped, never raised
    assert closed.closed


def test_a_start_while_the_child_is_exiting_after_its_run_ended_waits_for_it(tmp_path):
    mgr = RunManager(tmp_path / "runs", process=True)
    mgr._thread = threading.Thread(target=time.sleep, args=(1.0,))  # the follower of a child that is exiting
    mgr._thread.start()
    mgr.store.update_status(status="running")
    with pytest.raises(RunInProgressError):  # a run that has not ended is refused at once
        mgr._claim()
    mgr.store.update_status(status="stopped")  # what the page shows once the child reported its end
    mgr._claim()
    assert not mgr.active
    mgr._file_lock.release()
