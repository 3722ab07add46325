"""The state pages share, without a browser: presets, uploads, start/stop/resume, chart caching, runs."""

import time
from pathlib import Path

import pytest

from grpo_app.runs.manager import RunManager
from grpo_app.ui import render
from grpo_app.ui.forms import FormError, TrainForm
from grpo_app.ui.studio import FigureCache, Studio, ViewCache

from .conftest import checkpoint_files, wait_until

APP_CONFIGS = Path("tests/configs/app")


@pytest.fixture
def studio(tmp_path, monkeypatch):
    from grpo_app.core.models import cache_root

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))  # keep the embedded tokenizer the tiny model borrows
    monkeypatch.setenv("GRPO_APP_MODELS_DIR", str(tmp_path / "models"))
    s = Studio(manager=RunManager(tmp_path / "runs"), configs_dir=APP_CONFIGS, default_preset="tiny-short")
    yield s
    s.shutdown(timeout=120)


def form(studio, preset="tiny-short", **over):
    values, _ = studio.train.preset_form(preset)
    values.update(over)
    return TrainForm(preset=preset, **values)


def wait(pred, timeout=300):
    return wait_until(pred, timeout, every=0.2)


def test_presets_come_from_the_configs_folder(studio):
    assert list(studio.presets) == ["tiny-app", "tiny-short"] and studio.default_preset == "tiny-short"
    values, desc = studio.train.preset_form("tiny-app")
    assert values["stages"][0] == ["add", "arithmetic", 1, 1, 40, "", "", ""] and "Tests only" in desc
    with pytest.raises(FormError, match="unknown preset"):
        studio.train.preset_form("../configs/quick")


def test_upload_is_checked_and_saved(studio, tmp_path):
    good = tmp_path / "mine.jsonl"
    good.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+5?", "answer": "#### 7"}\n')
    saved, msg = studio.train.check_upload(str(good))
    assert Path(saved).parent == studio.uploads_dir and "2 problems" in msg
    assert studio.train.check_upload(str(good))[0] == saved  # the same content is stored once
    bad = tmp_path / "bad.csv"
    bad.write_text("question,answer\nwhat?,seven\nok?,3\n")
    with pytest.raises(FormError, match="row 2: answer 'seven' is not a number"):
        studio.train.check_upload(str(bad))
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * (studio.limits.max_upload_mb * 2**20 + 1))
    with pytest.raises(FormError, match="over the"):
        studio.train.check_upload(str(big))


def test_start_refuses_bad_forms_and_a_second_run_then_stop_and_resume(studio):
    res = studio.train.start(form(studio, num_generations=1, learning_rate="x"))
    assert not res.ok and "Nothing was started" in res.message
    assert set(res.errors) == {"num_generations", "learning_rate"} and studio.manager.runs() == []

    res = studio.train.start(form(studio, stages=[["a", "arithmetic", 1, 1, 30]]))
    assert res.ok and res.run_id
    second = studio.train.start(form(studio))
    assert not second.ok and "A run is in progress" in second.message
    assert wait(lambda: studio.train.status()["steps_recorded"] >= 1)
    st = studio.train.status()
    assert st["run_id"] == res.run_id and st["active"] and st["total_steps"] == 30

    assert studio.train.stop().ok
    assert wait(lambda: not studio.manager.active)
    assert studio.train.status()["state"] == "stopped"
    assert not studio.train.stop().ok  # nothing to stop any more
    assert "not a run id" in studio.train.resume("../x").message
    res2 = studio.train.resume(None)  # the newest resumable run
    assert res2.ok and res2.run_id == res.run_id
    studio.manager.stop()
    assert wait(lambda: not studio.manager.active)


def test_a_stop_before_the_first_step_promises_no_resume(studio):
    """Issue 45, 4: stopped before any step completed, the run has no checkpoint, so neither the badge nor
    the run log may say Resume continues it, and Resume says there is nothing to continue."""
    res = studio.train.start(form(studio, stages=[["a", "arithmetic", 1, 1, 30]]))
    assert res.ok and studio.train.stop().ok  # at once: the model is still loading
    assert wait(lambda: not studio.manager.active)
    st = studio.train.status()
    assert st["state"] == "stopped" and st["step"] == 0, st
    assert studio.manager.current_run.latest_checkpoint() is None
    assert "resumable" not in st["state_text"] and "nothing to resume" in st["state_text"], st["state_text"]
    log = render.events_md(studio.view()["events"])
    assert "Resume continues" not in log and "checkpoint ?" not in log, log
    assert "nothing to resume (Start again)" in log, log
    again = studio.train.resume(res.run_id)
    assert not again.ok and "no complete checkpoint" in again.message
    from grpo_app.runs import monitor

    disk = monitor.progress(monitor.disk_view(studio.manager.current_run))  # the Runs tab reads the folder
    assert "nothing to resume" in disk["state_text"], disk["state_text"]


def test_charts_are_built_once_per_version(studio):
    res = studio.train.start(form(studio))
    assert res.ok
    assert wait(lambda: not studio.manager.active)
    view = studio.view()
    builds = studio.figures.builds
    first = studio.train.chart_json(view)
    assert set(first) == {"reward", "loss", "length", "memory", "throughput"}
    assert studio.train.chart_json(view) == first and studio.figures.builds == builds + 2  # steps + memory, once
    assert '"uirevision":"' + res.run_id in first["reward"].replace(" ", "")


def test_a_run_records_every_problem_each_step_trained_on(studio):
    """Issue 46, 4: trained_problems.jsonl has one line per step with the problems of its groups, complete (the
    held-out check reads it; steps.jsonl may be thinned)."""
    from grpo_app.core.fileio import read_jsonl

    res = studio.train.start(form(studio))
    assert res.ok
    assert wait(lambda: not studio.manager.active)
    run = studio.manager.current_run
    lines = read_jsonl(run.trained_path)
    cfg = run.config()
    assert [r["step"] for r in lines] == list(range(1, cfg.total_steps + 1))
    assert [r["stage"] for r in lines] == [k for k, st in enumerate(cfg.stages) for _ in range(st.steps)]
    steps = {r["step"]: r for r in run.steps()}
    for r in lines:
        assert len(r["problems"]) == cfg.grpo.prompts_per_step
        assert [q for _, q in r["problems"]] == [g["question"] for g in steps[r["step"]]["groups"]]
        assert all(i.startswith("arith-") for i, _ in r["problems"])
    assert run.trained_questions() == {q for r in lines for _, q in r["problems"]}


def test_view_cache_ttl_and_invalidate(tmp_path):
    mgr = RunManager(tmp_path / "runs")
    cache = ViewCache(mgr, ttl=60)
    v = cache.get()
    assert cache.get() is v
    cache.invalidate()
    assert cache.get() is not v


def test_figure_cache_evicts_oldest():
    cache = FigureCache(size=2)
    for k in "abc":
        cache.get(k, lambda k=k: k.upper())
    assert cache.get("a", lambda: "rebuilt") == "rebuilt" and cache.builds == 4


def test_delete_needs_the_typed_run_id(studio):
    res = studio.train.start(form(studio))
    assert wait(lambda: not studio.manager.active)
    rid = res.run_id
    assert "type its id" in studio.runs.delete_run(rid, "yes").message
    assert "not a run id" in studio.runs.delete_run("../" + rid, rid).message
    assert studio.runs.delete_run(rid, rid).ok and studio.manager.runs() == []
    assert studio.view()["run_id"] is None  # the page no longer shows the deleted run


@pytest.mark.parametrize(
    "args,text",
    [
        (("run", "", "", "", "gsm8k", 5, 0, 10, 0, 64), "pick a run"),
        (("run", "../etc", "", "", "gsm8k", 5, 0, 10, 0, 64), "not a run id"),
        (("models", None, "embedded", "/etc", "gsm8k", 5, 0, 10, 0, 64), "trained model: '/etc' is outside"),
        (("models", None, "embedded", "embedded", "gsm8k", 0, 0, 10, 0, 64), "N (problems): 0 is out of range"),
        (("models", None, "embedded", "embedded", "gsm8k", "ten", 0, 10, 0, 64), "expected a whole number"),
        (("models", None, "embedded", "embedded", "gsm8k", 5, 6, 2, 0, 64), "is empty (max below min)"),
        (("models", None, "embedded", "embedded", "stage:0", 5, 0, 10, 0, 64), "need a run"),
        (("models", None, "embedded", "embedded", "mmlu", 5, 0, 10, 0, 64), "unknown problem set"),
        (("models", None, "embedded", "embedded", "gsm8k", 5, 0, 10, 0, 4), "max answer tokens"),
        (("both", None, "embedded", "embedded", "gsm8k", 5, 0, 10, 0, 64), "unknown mode"),
    ],
)
def test_compare_requests_are_checked(studio, args, text):
    with pytest.raises(FormError) as e:
        studio.compare.compare_spec(*args)
    assert any(text in m for _, m in e.value.errors), e.value.errors


def test_try_inputs_are_checked(studio):
    for args, text in (
        (("", None, 64), "Type a question"),
        (("q" * 5000, None, 64), "characters long"),
        (("What?", "seven", 64), "is not a number"),
        (("What?", None, 100000), "out of range"),
        ((["a list"], None, 64), "must be text"),
    ):
        with pytest.raises(FormError) as e:
            studio.tryout.check_try_input(*args)
        assert any(text in m for _, m in e.value.errors), (args, e.value.errors)
    assert studio.tryout.check_try_input("What is 2+2?", "4", 64) == 64


def test_train_tab_shows_a_resume_from_the_runs_tab_that_fails_at_once(studio):
    """Resume (as the Runs tab asks it) of an older run whose checkpoint cannot be loaded: the job fails at
    once, and the Train tab's status shows that run failing, with its error, not the newest run 'completed'."""
    from grpo_app.core.config import load_config
    from grpo_app.core.fileio import atomic_write_json
    from grpo_app.core.run_folder import RunDir

    root = studio.manager.root
    older = RunDir.create(root, load_config("tests/configs/tiny.yaml", ["model.name=tiny-random", "run.name=older"]))
    older.write_status(status="stopped", started=time.time() - 60)
    # looks complete and whole (its files pass the cheap checks), but its weights are not this model's: the
    # job starts, then fails loading them
    ck = checkpoint_files(older.checkpoints_dir / "stage-0" / "checkpoint-1")
    atomic_write_json(ck / "engine_state.json", {"stage_index": 0, "stage_step": 1, "global_step": 1})
    (ck / "COMPLETE").write_text("x")
    time.sleep(1.1)  # run ids carry the time to the second
    newer = RunDir.create(root, load_config("tests/configs/tiny.yaml", ["model.name=tiny-random", "run.name=newer"]))
    newer.write_status(status="completed", started=time.time(), ended=time.time())
    assert studio.train.status()["run_id"] == newer.id  # nothing launched here yet: the newest folder

    res = studio.train.resume(older.id)  # what the Runs tab's "Resume this run" calls
    assert res.ok, res.message
    assert wait(lambda: not studio.manager.active, 120)
    st = studio.train.status()
    assert st["run_id"] == older.id and st["state"] == "failed" and not st["active"], st
    assert st["error"] and older.read_status()["error"] == st["error"]  # the job's own failure, as recorded
    html = render.status_html(st)
    assert older.id in html and "failed" in html and "Error:" in html


def test_status_answer_is_computed_once_per_run_version_for_all_watchers(tmp_path, monkeypatch):
    """Thirty pages asking between two changes of the run get one computed answer (a cache hit each), the
    status line and run log likewise; a new metric makes one new answer; a running job's elapsed time still
    follows the clock."""
    import os

    import psutil

    import grpo_app.ui.services.train as studio_mod
    from grpo_app.core.config import load_config
    from grpo_app.core.run_folder import RunDir

    class LiveManager(RunManager):
        active = True  # a job in progress, without training anything

    mgr = LiveManager(tmp_path / "runs")
    run = RunDir.create(mgr.root, load_config("tests/configs/tiny.yaml", ["model.name=tiny-random"]))
    run.write_status(status="running", started=time.time() - 100, pid=os.getpid(),
                     pid_started=psutil.Process().create_time())
    mgr._run = run
    mgr.store.reset(run)
    studio = Studio(manager=mgr, configs_dir=APP_CONFIGS, view_ttl=0.0)

    computed = []
    real_progress = studio_mod.progress
    monkeypatch.setattr(studio_mod, "progress", lambda view, now=None: computed.append(1) or real_progress(view, now))
    renders = []
    real_events = studio_mod.render.events_md
    monkeypatch.setattr(studio_mod.render, "events_md", lambda ev, limit=8: renders.append(1) or real_events(ev, limit))

    answers = [studio.train.status() for _ in range(30)]
    lines = {studio.train.status_line(studio.view()) for _ in range(30)}
    logs = {studio.train.events_md(studio.view()) for _ in range(30)}
    assert len(computed) == 1 and len(renders) == 1  # one computation for thirty watchers
    assert len(lines) <= 2 and len(logs) == 1  # (the line may pass one second boundary)
    assert all(a["run_id"] == run.id and a["state"] == "running" for a in answers)
    assert 99 < answers[0]["elapsed_s"] <= answers[-1]["elapsed_s"] < 200  # the clock still moves

    mgr.store.add_metric({"step": 1, "stage": 0, "stage_name": "s1", "reward": 0.25, "step_seconds": 2.0})
    after = [studio.train.status() for _ in range(30)]
    assert len(computed) == 2 and all(a["last_step"] == 1 and a["reward"] == 0.25 for a in after)
