"""The engine end to end on a tiny random model: stages, Fisher, EWC, checkpoints, stop, resume."""

import json
import os
import time

import pytest
import torch

from grpo_app.config import load_config
from grpo_app.fileio import append_jsonl, read_jsonl
from grpo_app.manager import RunInProgressError, RunManager
from grpo_app.runs import RunDir

from .conftest import checkpoint_files


def tiny_cfg(runs, *extra):
    return load_config("tests/configs/tiny.yaml", [f"run.output_dir={runs}",
                                                    "rewards.weights={correctness: 1.0, text_length: 1.0}", *extra])


def wait_until(pred, timeout=120):
    t = time.time()
    while time.time() - t < timeout:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_two_stage_run_with_ewc(runs_dir, varied_reward):
    from transformers import AutoModelForCausalLM

    from grpo_app.models import load_model

    cfg = tiny_cfg(runs_dir)
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert mgr.wait(300)
    st = run.read_status()
    assert st["status"] == "completed", st
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert [m["stage"] for m in metrics] == [0, 0, 1, 1]
    assert all(m["ewc_penalty"] == 0 for m in metrics if m["stage"] == 0)
    assert all(m["ewc_penalty"] > 0 for m in metrics[3:]), metrics  # weights moved away from the anchor
    for key in ("reward", "loss", "completion_length", "rss_mb", "tokens_per_s", "step_seconds"):
        assert all(m[key] is not None for m in metrics), key
    assert set(metrics[0]["rewards"]) == {"correctness", "text_length"}
    events = [e["event"] for e in run.events()]
    assert events[:2] == ["model_loaded", "stage_start"]
    start = run.events()[1]
    assert (start["device"], start["precision"]) == ("cpu", "float32")  # no bf16 on a CPU (TRL's default)
    assert "fisher_done" in events and events[-1] == "finished"
    assert (run.ewc_dir / "stage-0" / "ewc.safetensors").is_file()
    step = json.loads(run.step_path.read_text())
    assert step["step"] == 4 and len(step["groups"]) == 2 and len(step["groups"][0]["completions"]) == 4
    g = step["groups"][0]
    assert len(g["advantages"]) == 4 and abs(sum(g["advantages"])) < 1e-3  # advantages are centred per group
    # final/ reloads and differs from the base weights
    trained = AutoModelForCausalLM.from_pretrained(run.final_dir)
    base, _, _ = load_model("tiny-random", seed=cfg.run.seed)
    tp, bp = dict(trained.named_parameters()), dict(base.named_parameters())
    changed = [n for n in bp if not torch.equal(bp[n], tp[n])]
    assert changed and "model.embed_tokens.weight" not in changed  # embeddings frozen by default
    assert all(ck["stage_index"] in (0, 1) for ck in run.checkpoints())
    assert len(run.checkpoints()) <= cfg.run.keep_checkpoints


def test_stop_then_resume_continues_from_the_checkpoint(runs_dir, varied_reward):
    cfg = tiny_cfg(runs_dir, "stages[0].steps=3", "stages[1].steps=3")
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert wait_until(lambda: len(mgr.snapshot()["metrics"]) >= 1)
    assert mgr.stop()
    assert mgr.wait(300)
    assert run.read_status()["status"] == "stopped"
    ck = run.latest_checkpoint()
    assert ck is not None and (run.path / "checkpoints").is_dir()
    stopped_at = ck["global_step"]
    assert stopped_at < 6
    assert any(e["event"] == "stopped" for e in run.events())
    with pytest.raises(ValueError):
        mgr.resume("../etc")
    run2 = mgr.resume(run.id)
    assert run2.id == run.id
    assert mgr.wait(300)
    assert run.read_status()["status"] == "completed"
    steps = [m["step"] for m in run.metrics()]
    assert steps == list(range(1, 7)), steps  # no gap, no duplicate
    resumed = [e for e in run.events() if e["event"] == "resumed"]
    assert resumed and resumed[0]["step"] == stopped_at
    with pytest.raises(ValueError, match="already completed"):
        mgr.resume(run.id)


def test_only_one_job_at_a_time(runs_dir, varied_reward):
    mgr = RunManager(runs_dir)
    mgr.start(tiny_cfg(runs_dir, "stages[0].steps=3"))
    try:
        with pytest.raises(RunInProgressError, match="in progress"):
            mgr.start(tiny_cfg(runs_dir))
        other = RunManager(runs_dir)  # another manager (e.g. another process) on the same folder
        with pytest.raises(RunInProgressError):
            other.start(tiny_cfg(runs_dir))
    finally:
        mgr.stop()
        mgr.wait(300)


def test_torn_last_line_is_skipped(tmp_path):
    p = tmp_path / "m.jsonl"
    append_jsonl(p, {"step": 1, "x": float("nan")})
    with open(p, "a") as fh:
        fh.write('{"step": 2, "x"')  # a crash mid-write
    assert read_jsonl(p) == [{"step": 1, "x": None}]


def test_dead_process_run_is_reported_interrupted(tmp_path):
    cfg = load_config("quick")
    run = RunDir.create(tmp_path, cfg)
    run.write_status(status="running", pid=2**22 + 12345, pid_started=1.0)
    assert run.effective_status() == "interrupted"
    run.write_status(status="running", pid=os.getpid(), pid_started=__import__("psutil").Process().create_time())
    assert run.effective_status() == "running"


def test_incomplete_checkpoint_is_never_chosen(tmp_path):
    run = RunDir.create(tmp_path, load_config("quick"))
    good = run.checkpoints_dir / "stage-0" / "checkpoint-2"
    bad = run.checkpoints_dir / "stage-0" / "checkpoint-4"
    for d, state in ((good, {"stage_index": 0, "stage_step": 2, "global_step": 2}),
                     (bad, {"stage_index": 0, "stage_step": 4, "global_step": 4})):
        d.mkdir(parents=True)
        (d / "engine_state.json").write_text(json.dumps(state))
    checkpoint_files(good)
    (good / "COMPLETE").write_text("x")
    assert run.latest_checkpoint()["stage_step"] == 2


def test_stop_during_generation_finishes_that_step_and_saves(runs_dir, varied_reward, monkeypatch):
    """Stop pressed while step 2 is sampling: step 2 completes, a checkpoint of step 2 is saved, nothing more runs."""
    import threading

    import grpo_app.trainer as trainer_mod

    real = trainer_mod.generate_completions
    calls, generating, stop_pressed = [], threading.Event(), threading.Event()

    def held_generation(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second step's sampling: hold it until Stop has been pressed
            generating.set()
            assert stop_pressed.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_mod, "generate_completions", held_generation)
    cfg = tiny_cfg(runs_dir, "stages[0].steps=4", "stages[1].steps=4", "run.save_every=0")
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert generating.wait(300), "training never reached its second generation"
    assert mgr.stop()
    assert mgr.snapshot()["status"]["status"] == "stopping"  # shown at once; applied at the step boundary
    stop_pressed.set()
    assert mgr.wait(300)

    assert run.read_status()["status"] == "stopped"
    assert [m["step"] for m in run.metrics()] == [1, 2]  # the step in progress finished; no third step
    assert len(calls) == 2
    ck = run.latest_checkpoint()
    assert ck is not None and ck["global_step"] == 2  # saved on stop although save_every=0
    assert [e["event"] for e in run.events()].count("stopped") == 1


def test_a_reward_that_raises_marks_the_run_failed_and_the_manager_keeps_working(runs_dir, monkeypatch):
    from grpo_app.rewards import REWARD_FUNCS

    calls = []

    def flaky(prompts, completions, **kw):
        calls.append(1)
        if len(calls) >= 2:
            raise ZeroDivisionError("reward exploded on purpose")
        return [0.0] * len(completions)

    monkeypatch.setitem(REWARD_FUNCS, "flaky", flaky)
    cfg = load_config("tests/configs/tiny.yaml", [f"run.output_dir={runs_dir}", "rewards.weights={flaky: 1.0}"])
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert mgr.wait(300)
    status = run.read_status()
    assert status["status"] == "failed"
    assert "ZeroDivisionError: reward exploded on purpose" in status["error"]
    err = [e for e in run.events() if e["event"] == "error"]
    assert err and "reward exploded" in err[0]["message"] and "Traceback" in err[0]["traceback"]
    assert [m["step"] for m in run.metrics()] == [1]  # what was done before the crash is kept
    assert mgr.snapshot()["status"]["status"] == "failed"

    monkeypatch.setitem(REWARD_FUNCS, "flaky", lambda prompts, completions, **kw: [0.0] * len(completions))
    again = mgr.start(load_config("tests/configs/tiny.yaml", [f"run.output_dir={runs_dir}", "rewards.weights={flaky: 1.0}",
                                                              "stages[0].steps=1", "stages[1].steps=1"]))
    assert mgr.wait(300) and again.read_status()["status"] == "completed"  # the manager took the next job
