"""The engine end to end on a tiny random model: stages, Fisher, EWC, checkpoints, stop, resume."""

import json
import os
import time
from pathlib import Path

import pytest
import torch

from grpo_app.core.config import load_config
from grpo_app.core.fileio import append_jsonl, read_jsonl
from grpo_app.core.run_folder import RunDir
from grpo_app.runs.manager import RunInProgressError, RunManager

from .conftest import checkpoint_files, wait_until


def tiny_cfg(runs, *extra):
    return load_config("tests/configs/tiny.yaml", [f"run.output_dir={runs}",
                                                    "rewards.weights={correctness: 1.0, text_length: 1.0}", *extra])



def test_two_stage_run_with_ewc(runs_dir, varied_reward):
    from transformers import AutoModelForCausalLM

    from grpo_app.core.models import load_model

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
    loaded = run.events()[0]  # the machine the times were measured on
    assert loaded["cpu"] and loaded["cpu_kernels"] == str(torch.backends.cpu.get_cpu_capability())
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


def test_stop_during_sampling_drops_that_step_and_keeps_the_last_complete_one(runs_dir, varied_reward, monkeypatch):
    """Stop pressed while step 3 samples with a huge budget: the sampling ends at its next token, step 3 is
    dropped, and the checkpoint of step 2 (not on the save schedule: written at the stop) holds exactly the
    weights step 3 was sampling with. Resume then continues from step 2 with no gap."""
    import threading

    from safetensors.torch import load_file

    import grpo_app.training.trainer as trainer_mod

    real = trainer_mod.generate_completions
    calls, sampling, stop_pressed, seen = [], threading.Event(), threading.Event(), {}

    def huge_third_sampling(model, tokenizer, prompts, params, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # step 3: a budget no step could finish, and Stop pressed while it samples
            seen["weights"] = {n: p.detach().clone() for n, p in model.state_dict().items()}
            seen["should_stop"] = kwargs.get("should_stop")
            params.max_new_tokens = 10**6
            params.stop_at_answer = False
            inner = kwargs.pop("on_tokens", None)

            def on_tokens(results):
                if max(len(r) for r in results) == 50:  # well inside the sampling
                    sampling.set()
                    assert stop_pressed.wait(120)
                if inner:
                    inner(results)

            out = real(model, tokenizer, prompts, params, on_tokens=on_tokens, **kwargs)
            seen["tokens"] = max(len(c) for c in out.completion_ids)
            return out
        return real(model, tokenizer, prompts, params, **kwargs)

    monkeypatch.setattr(trainer_mod, "generate_completions", huge_third_sampling)
    cfg = tiny_cfg(runs_dir, "stages[0].steps=4", "stages[1].steps=2", "run.save_every=0",
                   "grpo.max_completion_length=64")
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert sampling.wait(300), "training never reached its third sampling"
    assert mgr.stop()
    st = mgr.snapshot()["status"]
    assert st["status"] == "stopping" and "ending the sampling of step 3" in st["phase"], st  # what it waits for
    t0 = time.time()
    stop_pressed.set()
    assert mgr.wait(60)
    assert time.time() - t0 < 30, "the stop took effect inside the step"
    assert seen["tokens"] < 1000 and callable(seen["should_stop"])  # the budget was cut, not exhausted

    assert run.read_status()["status"] == "stopped"
    assert [m["step"] for m in run.metrics()] == [1, 2]  # step 3 never counted
    ck = run.latest_checkpoint()
    assert ck is not None and ck["global_step"] == 2  # the last complete step (written at the stop)
    saved = load_file(str(Path(ck["path"]) / "model.safetensors"))
    assert saved and all(torch.equal(t, seen["weights"][n]) for n, t in saved.items())  # exactly step 2's weights
    events = run.events()
    req = [e for e in events if e["event"] == "stop_requested"]
    assert len(req) == 1 and "sampling of step 3" in req[0]["waiting_for"]
    stopped = [e for e in events if e["event"] == "stopped"]
    assert len(stopped) == 1 and stopped[0]["abandoned_step"] == 3 and stopped[0]["during"] == "sampling"
    assert stopped[0]["step"] == 2 and stopped[0]["checkpoint"] == "checkpoint-2"

    mgr.resume(run.id)
    assert mgr.wait(300)
    assert run.read_status()["status"] == "completed"
    assert [m["step"] for m in run.metrics()] == [1, 2, 3, 4, 5, 6]
    assert [e for e in run.events() if e["event"] == "resumed"][0]["step"] == 2


def test_stop_between_micro_batches_drops_that_step(runs_dir, varied_reward, monkeypatch):
    """Stop pressed during the first micro-batch's forward/backward of step 2 (two micro-batches a step): the
    second micro-batch never runs, no optimizer step is taken, and checkpoint 1 (save_every=1) is kept as is."""
    import threading

    from grpo_app.training.trainer import CurriculumGRPOTrainer

    real = CurriculumGRPOTrainer._compute_loss
    calls, in_backward, stop_pressed = [], threading.Event(), threading.Event()

    def held_loss(self, model, inputs):
        calls.append(self.state.global_step)
        if len(calls) == 3:  # step 2, micro-batch 1 of 2
            in_backward.set()
            assert stop_pressed.wait(120)
        return real(self, model, inputs)

    monkeypatch.setattr(CurriculumGRPOTrainer, "_compute_loss", held_loss)
    cfg = tiny_cfg(runs_dir, "stages[0].steps=3", "grpo.micro_batch_size=4")
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert in_backward.wait(300)
    ck1 = run.latest_checkpoint()
    assert ck1["global_step"] == 1
    mtime = (Path(ck1["path"]) / "COMPLETE").stat().st_mtime_ns
    assert mgr.stop()
    assert "micro-batch 1/2 of step 2" in mgr.snapshot()["status"]["phase"]
    stop_pressed.set()
    assert mgr.wait(60)

    assert run.read_status()["status"] == "stopped"
    assert calls == [0, 0, 1]  # step 1: two micro-batches; step 2: the first only
    assert [m["step"] for m in run.metrics()] == [1]
    ck = run.latest_checkpoint()
    assert ck["global_step"] == 1 and (Path(ck["path"]) / "COMPLETE").stat().st_mtime_ns == mtime  # untouched
    stopped = [e for e in run.events() if e["event"] == "stopped"][0]
    assert stopped["abandoned_step"] == 2 and stopped["during"] == "micro-batch" and stopped["step"] == 1
    assert "checkpoint_written_at_stop" not in stopped


def test_stop_during_the_fisher_pass_keeps_the_end_of_stage_checkpoint(runs_dir, varied_reward, monkeypatch):
    """Stop pressed during the Fisher after stage 1: the pass is abandoned (a partial Fisher is never saved),
    the end-of-stage checkpoint stays, and Resume redoes the Fisher before stage 2."""
    import threading

    import grpo_app.training.ewc as ewc_mod

    real = ewc_mod.sequence_logprob
    calls, in_fisher, stop_pressed = [], threading.Event(), threading.Event()

    def held(model, prompt, completion):
        calls.append(1)
        if len(calls) == 2:
            in_fisher.set()
            assert stop_pressed.wait(120)
        return real(model, prompt, completion)

    monkeypatch.setattr(ewc_mod, "sequence_logprob", held)
    cfg = tiny_cfg(runs_dir)
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert in_fisher.wait(300)
    assert mgr.stop()
    assert "Fisher pass after stage 1" in mgr.snapshot()["status"]["phase"]
    stop_pressed.set()
    assert mgr.wait(60)
    assert run.read_status()["status"] == "stopped"
    assert len(calls) == 2  # no Fisher sample after the stop
    assert not (run.ewc_dir / "stage-0" / "ewc.json").exists()
    stopped = [e for e in run.events() if e["event"] == "stopped"][0]
    assert stopped["during"] == "fisher" and stopped["step"] == 2
    assert run.latest_checkpoint()["global_step"] == 2
    monkeypatch.setattr(ewc_mod, "sequence_logprob", real)
    mgr.resume(run.id)
    assert mgr.wait(300) and run.read_status()["status"] == "completed"
    assert (run.ewc_dir / "stage-0" / "ewc.json").is_file()
    assert [m["step"] for m in run.metrics()] == [1, 2, 3, 4]


def _run_whose_reward_raises_at_step_2(runs_dir, monkeypatch, name: str, error: BaseException):
    """The tiny preset trained with one reward, `name`, that raises `error` on its second call (step 2)."""
    from grpo_app.core.rewards import REWARD_FUNCS

    calls = []

    def reward(prompts, completions, **kw):
        calls.append(1)
        if len(calls) >= 2:
            raise error
        return [0.0] * len(completions)

    monkeypatch.setitem(REWARD_FUNCS, name, reward)
    cfg = load_config("tests/configs/tiny.yaml", [f"run.output_dir={runs_dir}", f"rewards.weights={{{name}: 1.0}}"])
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert mgr.wait(300)
    return mgr, run


def test_a_reward_that_raises_marks_the_run_failed_and_the_manager_keeps_working(runs_dir, monkeypatch):
    from grpo_app.core.rewards import REWARD_FUNCS

    mgr, run = _run_whose_reward_raises_at_step_2(runs_dir, monkeypatch, "flaky",
                                                  ZeroDivisionError("reward exploded on purpose"))
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


def test_a_full_disk_says_so_and_how_to_go_on(runs_dir, monkeypatch):
    """A run that cannot write for want of disk space fails with a message that names the cause and the way on,
    without the server's paths; torch's own words for a checkpoint cut short count when the disk is (nearly) full."""
    import errno
    import shutil
    from collections import namedtuple

    from grpo_app.runs import manager

    full = OSError(errno.ENOSPC, "No space left on device", "/srv/secret/models/runs/x/steps.jsonl")
    _, run = _run_whose_reward_raises_at_step_2(runs_dir, monkeypatch, "full", full)
    status = run.read_status()
    assert status["status"] == "failed"
    assert status["error"].startswith("the disk is full") and "resume" in status["error"]
    assert "/srv/secret" not in status["error"] and "No space left on device" in status["error"]

    usage = namedtuple("usage", "total used free")
    cut_short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 235449152 vs 235449040")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - 440 * 1024, 440 * 1024))
    assert manager.failure_message(cut_short, runs_dir).startswith("the disk is full")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**11, 9 * 10**11))
    assert manager.failure_message(cut_short, runs_dir) == f"RuntimeError: {cut_short}"  # room left: not the disk
    assert manager.failure_message(ZeroDivisionError("x"), runs_dir) == "ZeroDivisionError: x"


def test_trainable_layers_leave_the_lower_layers_as_they_were(runs_dir, varied_reward):
    """model.trainable_layers=1 on the 2-layer tiny model: layer 0 ends bit-identical to the base, layer 1
    trains, and the Fisher/EWC state covers only what trains."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from grpo_app.core.models import load_model

    cfg = tiny_cfg(runs_dir, "model.trainable_layers=1")
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert mgr.wait(300)
    assert run.read_status()["status"] == "completed"
    trained = dict(AutoModelForCausalLM.from_pretrained(run.final_dir).named_parameters())
    base = dict(load_model("tiny-random", seed=cfg.run.seed)[0].named_parameters())
    changed = {n for n in base if not torch.equal(base[n], trained[n])}
    assert changed and all(n.startswith(("model.layers.1.", "model.norm.")) for n in changed), changed
    with safe_open(str(run.ewc_dir / "stage-0" / "ewc.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and not any("layers.0." in k or "embed_tokens" in k for k in keys), keys
