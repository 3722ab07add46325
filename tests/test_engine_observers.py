"""The engine's supported hook for benches and tools (`engine.Observer`, issue 43): what it sees and when,
so a bench observes training without patching the engine's private names."""

from __future__ import annotations

import pytest
import torch

from grpo_app.core.config import load_config
from grpo_app.core.run_folder import RunDir
from grpo_app.runs.manager import RunManager
from grpo_app.training import engine


class Log(engine.Observer):
    def __init__(self):
        self.calls = []
        self.final_weights = None

    def step_end(self, model, step, stage):
        trainable = [p.detach().double().sum() for p in model.parameters() if p.requires_grad]
        self.calls.append(("step", step, stage, float(sum(trainable))))

    def fisher_begin(self, stage):
        self.calls.append(("fisher_begin", stage))

    def fisher_end(self, stage):
        self.calls.append(("fisher_end", stage))

    def stage_end(self, model, stage):
        self.calls.append(("stage_end", stage))

    def before_final_save(self, model):
        self.calls.append(("final",))
        self.final_weights = {n: p.detach().clone() for n, p in model.named_parameters()}


def test_an_observer_sees_every_step_stage_end_fisher_pass_and_the_final_model(tmp_path, varied_reward):
    cfg = load_config("tests/configs/tiny.yaml", [f"run.output_dir={tmp_path}", "run.save_every=0",
                                                  "rewards.weights={text_length: 1.0}"])
    run = RunDir.create(tmp_path, cfg)
    log = Log()
    assert engine.train(cfg, run, observers=[log]) == "completed"
    kinds = [c[:3] if c[0] == "step" else c for c in log.calls]
    assert kinds == [
        ("step", 1, 0), ("step", 2, 0), ("stage_end", 0), ("fisher_begin", 0), ("fisher_end", 0),
        ("step", 3, 1), ("step", 4, 1), ("stage_end", 1), ("final",),
    ]
    sums = [c[3] for c in log.calls if c[0] == "step"]
    assert len(set(sums)) > 1  # it is handed the live model: the weights it sees move from step to step
    from safetensors.torch import load_file

    saved = load_file(str(run.final_dir / "model.safetensors"))
    assert saved and all(torch.equal(t, log.final_weights[n]) for n, t in saved.items() if n in log.final_weights)  # before_final_save saw the model that was written


def test_a_run_without_observers_is_unchanged_and_a_child_process_manager_refuses_them(tmp_path):
    cfg = load_config("tests/configs/tiny.yaml", [f"run.output_dir={tmp_path}", "run.save_every=0",
                                                  "ewc.enabled=false", "stages[1].steps=1"])
    assert engine.train(cfg, RunDir.create(tmp_path, cfg)) == "completed"
    with pytest.raises(ValueError, match="in this process"):
        RunManager(tmp_path / "runs", process=True).start(cfg, observers=[Log()])
