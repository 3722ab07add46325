"""A stage's `carry_moments`: its AdamW starts from the moments the previous stage ended with (trainer.py,
departure 11), in a straight run, resumed at the stage's start, and in a branch (bench/stage_branch.py)."""

from __future__ import annotations

import shutil

import pytest
import torch

from grpo_app.core.config import ConfigError, load_config
from grpo_app.core.run_folder import RunDir
from grpo_app.training import engine
from grpo_app.training.optim import AdamWBF16Moments, load_moments


def _cfg(tmp_path, *extra):
    return load_config("tests/configs/tiny.yaml", [
        f"run.output_dir={tmp_path}", "rewards.weights={text_length: 1.0}", "ewc.enabled=true",
        "run.save_every=1", "run.keep_checkpoints=10", "stages[1].learning_rate=0.003",
        "run.seed=0", *extra])  # (seed 0: the tiny base model a branch rebuilds, load_for_eval, is the run's)


class Optimizers:
    """Records each stage's optimizer as it was built (before its first step) and as it ended."""

    def __init__(self, monkeypatch):
        self.start, self.end = [], []
        orig_create, orig_train = engine.CurriculumGRPOTrainer.create_optimizer, engine.CurriculumGRPOTrainer.train

        def create(tr, model=None):
            opt = orig_create(tr, model)
            self.start.append(_copy(opt))
            return opt

        def train(tr, *a, **k):
            out = orig_train(tr, *a, **k)
            self.end.append(_copy(tr.optimizer))
            return out

        monkeypatch.setattr(engine.CurriculumGRPOTrainer, "create_optimizer", create)
        monkeypatch.setattr(engine.CurriculumGRPOTrainer, "train", train)


def _copy(opt) -> dict:
    sd = opt.state_dict()
    return {"lr": [g["lr"] for g in opt.param_groups],
            "state": {i: {n: v.clone() for n, v in s.items()} for i, s in sd["state"].items()}}


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[i].keys() == b[i].keys() and all(torch.equal(a[i][n], b[i][n]) for n in a[i]) for i in a)


def _final(run) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run.final_dir / "model.safetensors"))


def test_only_a_later_stage_may_carry_moments(tmp_path, varied_reward):
    with pytest.raises(ConfigError, match="carry_moments.*first stage has no earlier optimizer moments"):
        _cfg(tmp_path, "stages[0].carry_moments=true")
    with pytest.raises(ConfigError, match="carry_moments"):
        _cfg(tmp_path, "stages[1].carry_moments=maybe")
    assert _cfg(tmp_path, "stages[1].carry_moments=true").stages[1].carry_moments


@pytest.mark.parametrize("carry", [True, False])
def test_a_carrying_stage_starts_from_the_moments_the_last_one_ended_with(tmp_path, varied_reward, monkeypatch, carry):
    opts = Optimizers(monkeypatch)
    cfg = _cfg(tmp_path, f"stages[1].carry_moments={str(carry).lower()}")
    assert engine.train(cfg, RunDir.create(tmp_path, cfg)) == "completed"
    (start1, start2), (end1, end2) = opts.start, opts.end
    assert start1["state"] == {} and end1["state"]  # stage 1: a fresh AdamW, which then stepped
    if carry:
        assert _same_state(start2["state"], end1["state"])  # both moments and their step count, as stage 1 left them
        assert all(int(s["step"]) == 2 for s in start2["state"].values())
        assert all(int(s["step"]) == 4 for s in end2["state"].values())  # ... counted on: no bias correction restart
    else:
        assert start2["state"] == {}
    assert start2["lr"] != end1["lr"] and all(lr == pytest.approx(0.003) for lr in start2["lr"])  # its own rate


def test_resumed_at_the_stage_start_the_moments_come_from_the_stage_end_checkpoint(tmp_path, varied_reward, monkeypatch):
    """A run stopped once stage 1 and its Fisher had ended resumes into stage 2 with the moments the straight run
    carried (read from the checkpoint of stage 1's last step), and trains to the same model; a checkpoint
    without them is refused with what to do."""
    opts = Optimizers(monkeypatch)
    cfg = _cfg(tmp_path / "straight", "stages[1].carry_moments=true")
    straight = RunDir.create(tmp_path / "straight", cfg)
    assert engine.train(cfg, straight) == "completed"
    carried = opts.start[1]["state"]

    class StopAfterStage1(engine.Reporter):
        def __init__(self):
            self.ended = False

        def event(self, kind, **data):
            self.ended = self.ended or kind == "fisher_done"

        def should_stop(self):
            return self.ended

    cfg2 = _cfg(tmp_path / "resumed", "stages[1].carry_moments=true")
    run = RunDir.create(tmp_path / "resumed", cfg2)
    assert engine.train(cfg2, run, reporter=StopAfterStage1()) == "stopped"
    assert run.latest_checkpoint()["stage_index"] == 0 and not run.final_dir.exists()
    opts.start.clear()
    assert engine.train(cfg2, run, resume=True) == "completed"
    assert _same_state(opts.start[0]["state"], carried)
    final_a, final_b = _final(straight), _final(run)
    assert all(torch.equal(final_a[n], final_b[n]) for n in final_a)

    (run.final_dir / "model.safetensors").unlink()
    shutil.rmtree(run.checkpoints_dir / "stage-1")
    (run.checkpoints_dir / "stage-0" / "checkpoint-2" / "optimizer.pt").unlink()
    with pytest.raises(RuntimeError, match=r"stage 2 starts from the optimizer moments.*resume with carry_moments off"):
        engine.train(cfg2, run, resume=True)


def test_a_branch_that_carries_moments_starts_from_the_sources(tmp_path, varied_reward, monkeypatch):
    """bench/stage_branch.py copies the optimizer state of the source's stage-end checkpoint, and the branch
    replays the straight run's stage 2 to the same model; without that checkpoint the branch is refused."""
    from bench.stage_branch import branch

    cfg = _cfg(tmp_path / "src", "stages[1].carry_moments=true")
    src = RunDir.create(tmp_path / "src", cfg)
    assert engine.train(cfg, src) == "completed"
    monkeypatch.setenv("GRPO_APP_RUNS_DIR", str(tmp_path / "branches"))
    path = branch(src.path, 1, cfg)
    run = RunDir(path)
    end = src.checkpoints_dir / "stage-0" / "checkpoint-2" / "optimizer.pt"
    assert (run.checkpoints_dir / "stage-0" / "checkpoint-2" / "optimizer.pt").read_bytes() == end.read_bytes()
    assert engine.train(run.config(), run, resume=True) == "completed"
    final_a, final_b = _final(src), _final(run)
    assert all(torch.equal(final_a[n], final_b[n]) for n in final_a)
    end.unlink()
    with pytest.raises(SystemExit, match="no longer has the checkpoint of stage 1's end"):
        branch(src.path, 1, cfg)
    assert branch(src.path, 1, _cfg(tmp_path / "src", "stages[1].carry_moments=false"))  # a fresh optimizer needs none


def test_moments_of_other_weights_are_refused():
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 4)
    opt_a, opt_b = AdamWBF16Moments(a.parameters(), lr=0.1), AdamWBF16Moments(b.parameters(), lr=0.2)
    for m, opt in ((a, opt_a), (b, opt_b)):
        m(torch.ones(1, 3)).sum().backward()
        opt.step()
    with pytest.raises(ValueError, match="another model"):
        load_moments(opt_b, opt_a.state_dict())
    fresh = AdamWBF16Moments(a.parameters(), lr=0.5)
    load_moments(fresh, opt_a.state_dict())
    assert fresh.param_groups[0]["lr"] == 0.5 and fresh.state[a.weight]["exp_avg"].dtype == torch.bfloat16
    assert torch.equal(fresh.state[a.weight]["exp_avg"], opt_a.state[a.weight]["exp_avg"])
    with pytest.raises(ValueError, match="groups of"):
        load_moments(AdamWBF16Moments([{"params": [a.weight]}, {"params": [a.bias]}], lr=0.1), opt_a.state_dict())
