"""run.report_to: TRL's own trackers, offline, inside the run folder. A tiny run with TensorBoard on, read back."""

import pytest

from grpo_app.core import config as config_mod
from grpo_app.core.config import ConfigError, load_config
from grpo_app.runs.manager import RunManager
from grpo_app.training.engine import tensorboard_dir
from grpo_app.training.settings import grpo_args, trackers


def tiny(runs, *extra):
    return load_config("tests/configs/tiny.yaml", [f"run.output_dir={runs}", *extra])


def test_default_is_no_tracker(tmp_path):
    cfg = tiny(tmp_path)
    assert cfg.run.report_to == [] and trackers(cfg) == []
    assert grpo_args(cfg, 0, tmp_path, "cpu").report_to in ([], "none", ["none"])


def test_a_set_override_names_a_tracker_and_reaches_trl(tmp_path):
    cfg = tiny(tmp_path, "run.report_to=tensorboard")  # a plain word becomes a one-item list
    assert cfg.run.report_to == ["tensorboard"]
    assert grpo_args(cfg, 0, tmp_path, "cpu", run_name="r-stage1").report_to == ["tensorboard"]
    assert tiny(tmp_path, "run.report_to=none").run.report_to == ["none"]
    assert trackers(tiny(tmp_path, "run.report_to=none")) == []


def test_unknown_or_missing_trackers_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as e:
        tiny(tmp_path, "run.report_to=[tensorbord]")
    assert e.value.errors == [("run.report_to", "'tensorbord' is not one of tensorboard, trackio, wandb (or leave it empty).")]
    # a tracker that is not installed (pinned to a module that cannot exist, whatever this machine has)
    monkeypatch.setitem(config_mod._REPORT_TO_MODULES, "wandb", "no_such_module_for_the_test")
    with pytest.raises(ConfigError) as e:
        tiny(tmp_path, "run.report_to=[wandb]")
    assert e.value.errors == [("run.report_to", "'wandb' is not installed here; pip install wandb, or remove it.")]
    with pytest.raises(ConfigError):
        tiny(tmp_path, "run.report_to=[none, tensorboard]")


def test_tensorboard_event_files_hold_the_runs_reward_and_loss(runs_dir, varied_reward):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny(runs_dir, "rewards.weights={correctness: 1.0, text_length: 1.0}", "stages[0].steps=2",
               "stages[1].steps=1", "run.report_to=[tensorboard]")
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert mgr.wait(400)
    assert run.read_status()["status"] == "completed", run.read_status()
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for k, stage_steps in ((0, [1, 2]), (1, [1])):
        folder = tensorboard_dir(run, k)
        assert folder.is_dir() and folder.parent.parent == run.path  # inside the run folder
        acc = EventAccumulator(str(folder))
        acc.Reload()
        tags = acc.Tags()["scalars"]
        assert {"train/reward", "train/loss"} <= set(tags), tags
        reward = acc.Scalars("train/reward")
        loss = acc.Scalars("train/loss")
        assert [e.step for e in reward] == stage_steps and [e.step for e in loss] == stage_steps
        # the same numbers the run's own metrics.jsonl recorded for those steps (float32 in the event file)
        recs = [m for m in metrics if m["stage"] == k]
        assert [e.value for e in reward] == pytest.approx([m["reward"] for m in recs], rel=1e-6, abs=1e-7)
        assert [e.value for e in loss] == pytest.approx([m["loss"] for m in recs], rel=1e-6, abs=1e-7)
