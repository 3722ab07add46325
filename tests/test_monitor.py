"""What pages show about training: views of the live job and of run folders, progress, resume target."""

import json
import os
import time

import psutil
import pytest

from grpo_app.core.config import load_config
from grpo_app.core.fileio import append_jsonl, atomic_write_json
from grpo_app.core.run_folder import RunDir
from grpo_app.runs import monitor
from grpo_app.runs.manager import RunStore

from .conftest import checkpoint_files


def make_run(root, name="r", steps=(3, 2), status="completed", n_metrics=0, checkpoint=None, **status_fields):
    cfg = load_config(
        "tests/configs/tiny.yaml", [f"run.name={name}", f"stages[0].steps={steps[0]}", f"stages[1].steps={steps[1]}"]
    )
    run = RunDir.create(root, cfg)
    run.write_status(status=status, started=1000.0, **status_fields)
    for i in range(n_metrics):
        run.append_metric(
            {
                "step": i + 1,
                "stage": 0 if i < steps[0] else 1,
                "stage_name": "s",
                "reward": 0.1 * i,
                "step_seconds": 2.0,
                "tokens_per_s": 50.0,
            }
        )
    if checkpoint is not None:
        ck = run.checkpoints_dir / "stage-0" / f"checkpoint-{checkpoint}"
        checkpoint_files(ck)
        (ck / "COMPLETE").write_text("")
        atomic_write_json(
            ck / "engine_state.json", {"stage_index": 0, "stage_step": checkpoint, "global_step": checkpoint}
        )
    return run


class FakeManager:
    """The part of RunManager that monitor reads."""

    def __init__(self, root, run=None, active=False):
        self.root, self._run, self.active, self.store = root, run, active, RunStore()
        if run is not None:
            self.store.reset(run, metrics=run.metrics(), events=run.events())

    @property
    def current_run(self):
        return self._run

    def snapshot(self):
        snap = self.store.snapshot()
        snap["active"] = self.active
        return snap

    def runs(self):
        from grpo_app.core.run_folder import list_runs

        return list_runs(self.root)


def test_plan_reads_the_configured_stages(tmp_path):
    run = make_run(tmp_path)
    stages, total, weights = monitor.plan(run)
    assert stages == [{"name": "s1", "steps": 3}, {"name": "s2", "steps": 2}] and total == 5
    assert weights == {"correctness": 1.0, "has_number": 1.0}


def test_current_view_is_empty_without_runs(tmp_path):
    view = monitor.current_view(FakeManager(tmp_path))
    assert view["run_id"] is None and view["state"] == "idle" and view["metrics"] == []


def test_disk_view_follows_file_changes_with_separate_memory_marker(tmp_path):
    run = make_run(tmp_path, n_metrics=2)
    v1 = monitor.disk_view(run)
    assert [m["step"] for m in v1["metrics"]] == [1, 2] and v1["state"] == "completed" and not v1["live"]
    assert monitor.disk_view(run)["version"] == v1["version"]  # nothing changed: same marker
    time.sleep(0.01)
    run.append_metric({"step": 3, "stage": 0, "reward": 0.5})
    v2 = monitor.disk_view(run)
    assert v2["version"] != v1["version"] and len(v2["metrics"]) == 3
    mem_before = v2["mem_version"]
    append_jsonl(run.memory_path, {"time": 1.0, "rss_mb": 100.0})
    v3 = monitor.disk_view(run)
    assert v3["version"] == v2["version"] and v3["mem_version"] != mem_before and len(v3["memory"]) == 1


def test_current_view_prefers_the_live_job_then_the_newest_folder(tmp_path):
    old = make_run(tmp_path, name="old")
    time.sleep(1.1)  # run ids carry a timestamp to the second
    new = make_run(tmp_path, name="new", n_metrics=1)
    mgr = FakeManager(tmp_path)
    assert monitor.current_view(mgr)["run_id"] == new.id  # idle server: newest folder from disk
    mgr = FakeManager(tmp_path, run=old, active=True)
    view = monitor.current_view(mgr)
    assert view["run_id"] == old.id and view["live"] and view["active"]
    mgr.active = False  # the job ended: it stays on show although a newer (finished) folder exists
    assert monitor.current_view(mgr)["run_id"] == old.id


def test_the_last_job_of_this_server_is_shown_with_its_failure(tmp_path):
    """A Resume of an older run (e.g. from the Runs tab) that fails at once: the Train tab shows that failure,
    not the newest folder's 'completed'; a job another process is running now in a newer folder wins."""
    old = make_run(tmp_path, name="old", status="failed", error="RuntimeError: checkpoint unreadable")
    time.sleep(1.1)
    new = make_run(tmp_path, name="new", n_metrics=2)
    mgr = FakeManager(tmp_path, run=old, active=False)
    view = monitor.current_view(mgr)
    assert view["run_id"] == old.id and view["state"] == "failed" and view["live"]
    p = monitor.progress(view)
    assert p["state_text"] == "failed" and "checkpoint unreadable" in p["error"]
    new.write_status(status="running", pid=os.getpid(), pid_started=psutil.Process().create_time())
    assert monitor.current_view(mgr)["run_id"] == new.id  # e.g. a CLI run training now


def test_a_deleted_current_run_is_not_shown(tmp_path):
    run = make_run(tmp_path)
    mgr = FakeManager(tmp_path, run=run, active=False)
    assert monitor.current_view(mgr)["run_id"] == run.id
    import shutil

    shutil.rmtree(run.path)
    assert monitor.current_view(mgr)["run_id"] is None


def test_live_view_versions_change_with_the_store(tmp_path):
    run = make_run(tmp_path, status="running", pid=os.getpid(), pid_started=psutil.Process().create_time())
    mgr = FakeManager(tmp_path, run=run, active=True)
    v1 = monitor.live_view(mgr)
    mgr.store.add_metric({"step": 1, "stage": 0, "reward": 0.0})
    v2 = monitor.live_view(mgr)
    assert v1["version"] != v2["version"] and v2["metrics"][-1]["step"] == 1
    mgr.store.add_memory({"time": 1.0, "rss_mb": 1.0})
    v3 = monitor.live_view(mgr)
    assert v3["version"] == v2["version"] and v3["mem_version"] != v2["mem_version"]


def test_the_charts_marker_moves_with_steps_and_events_not_with_status_updates(tmp_path):
    run = make_run(tmp_path, status="running", pid=os.getpid(), pid_started=psutil.Process().create_time())
    mgr = FakeManager(tmp_path, run=run, active=True)
    v1 = monitor.live_view(mgr)
    for phase in ("sampling", "training", "saving"):  # several status updates in one step
        mgr.store.update_status(phase=phase)
    mgr.store.set_step({"step": 1, "groups": []})
    v2 = monitor.live_view(mgr)
    assert v2["version"] != v1["version"] and v2["charts_version"] == v1["charts_version"]
    mgr.store.add_metric({"step": 1, "stage": 0, "reward": 0.0})
    v3 = monitor.live_view(mgr)
    mgr.store.add_event({"event": "stage_end"})
    v4 = monitor.live_view(mgr)
    assert len({v2["charts_version"], v3["charts_version"], v4["charts_version"]}) == 3
    disk = monitor.disk_view(run)
    time.sleep(0.01)
    run.write_status(phase="training")
    assert monitor.disk_view(run)["charts_version"] == disk["charts_version"]
    run.append_metric({"step": 9, "stage": 0, "reward": 0.5})
    assert monitor.disk_view(run)["charts_version"] != disk["charts_version"]


def test_progress_stage_step_elapsed_eta_and_tokens():
    now = 2000.0
    view = {
        "run_id": "r",
        "state": "running",
        "active": True,
        "total_steps": 10,
        "stages": [{"name": "a", "steps": 5}, {"name": "b", "steps": 5}],
        "status": {"stage": 0, "stage_name": "a", "started": 1000.0},
        "started": 1000.0,
        "metrics": [
            {"step": i, "stage": 0, "step_seconds": s, "tokens_per_s": 42.0} for i, s in enumerate([1, 9, 2, 2], 1)
        ],
        "events": [{"event": "resumed", "time": 1500.0}, {"event": "fisher_done", "seconds": 7.0}],
    }
    p = monitor.progress(view, now=now)
    assert (p["stage"], p["n_stages"], p["step"], p["total_steps"]) == (1, 2, 4, 10)
    assert p["elapsed_s"] == 500.0  # since the last resume
    assert p["eta_s"] == pytest.approx(2.0 * 6 + 7.0)  # median step time x steps left + one Fisher pass ahead
    assert p["tokens_per_s"] == 42.0 and p["state_text"] == "running"
    done = monitor.progress(
        {**view, "active": False, "state": "completed", "status": {**view["status"], "ended": 1600.0}}, now=now
    )
    assert done["eta_s"] is None and done["elapsed_s"] == 100.0


def test_resume_target_prefers_a_resumable_run_with_a_checkpoint(tmp_path):
    make_run(tmp_path, name="done", status="completed", checkpoint=2)
    time.sleep(1.1)
    stopped = make_run(tmp_path, name="stopped", status="stopped", checkpoint=2)
    time.sleep(1.1)
    make_run(tmp_path, name="nockpt", status="stopped")  # nothing to resume from
    mgr = FakeManager(tmp_path)
    assert monitor.resume_target(mgr).id == stopped.id
    assert monitor.resumable(stopped)


def test_interrupted_run_is_reported_and_resumable(tmp_path):
    run = make_run(tmp_path, status="running", pid=999999, pid_started=1.0, checkpoint=1)  # no such process
    assert monitor.disk_view(run)["state"] == "interrupted"
    assert monitor.resumable(run)


@pytest.mark.parametrize("seconds,text", [(None, "–"), (0, "0:00"), (59.4, "0:59"), (61, "1:01"), (3725, "1:02:05")])
def test_fmt_duration(seconds, text):
    assert monitor.fmt_duration(seconds) == text


def test_status_json_is_plain(tmp_path):
    run = make_run(tmp_path, n_metrics=2)
    p = monitor.progress(monitor.disk_view(run))
    assert json.loads(json.dumps(p)) == p  # plain JSON values only: what the status API returns survives as is
    assert (p["run_id"], p["state"], p["step"], p["total_steps"], p["n_stages"]) == (run.id, "completed", 2, 5, 2)
    assert p["reward"] == pytest.approx(0.1) and p["tokens_per_s"] == 50.0
