"""One path from a setting to the trainer (issue 43, item 2): training/settings.py is the only module that
turns a Config into TRL's GRPOConfig and the trainer's options, under the config's own names."""

import dataclasses

import pytest

from grpo_app.core.config import GRPOSettings, load_config
from grpo_app.training.settings import engine_options, grpo_args, trainer_settings
from grpo_app.training.trainer import EngineOptions

# GRPOConfig fields that share a GRPOSettings name but are translated on purpose (and why)
TRANSLATED = {
    "top_k": "0 (= off) becomes None",
    "max_grad_norm": "0 (= no clipping) becomes 1e9",
    "learning_rate": "a stage's own learning rate wins (goal 3 of issue 42)",
    "gradient_checkpointing": "the engine's own layer recompute (prepare_model); TRL's stays off",
    "warmup_steps": "a stage's own warm-up wins",
}


@pytest.mark.parametrize("overrides", [[], ["grpo.top_k=5", "grpo.max_grad_norm=0.5", "grpo.temperature=0.7",
                                            "grpo.micro_batch_size=0", "grpo.prompts_per_step=3"]])
def test_every_shared_name_reaches_trl_unchanged_and_sizes_come_from_the_config(tmp_path, overrides):
    cfg = load_config("tests/configs/tiny.yaml", overrides)
    args = grpo_args(cfg, 0, tmp_path, "cpu")
    shared = [f.name for f in dataclasses.fields(GRPOSettings) if hasattr(args, f.name) and f.name not in TRANSLATED]
    assert {"num_generations", "temperature", "loss_type", "scale_rewards", "beta", "epsilon"} <= set(shared)
    for name in shared:
        assert getattr(args, name) == getattr(cfg.grpo, name), name
    assert args.per_device_train_batch_size == cfg.micro_batch
    assert args.gradient_accumulation_steps == cfg.accumulation_steps == args.steps_per_generation
    assert cfg.micro_batch * cfg.accumulation_steps == cfg.grpo.generation_batch == \
        cfg.grpo.prompts_per_step * cfg.grpo.num_generations


def test_engine_options_take_the_config_names_and_the_ewc_flag_is_not_inverted():
    cfg = load_config("tests/configs/tiny.yaml", ["grpo.force_answer_line=0.25", "grpo.force_answer_line_loss=mask",
                                                   "grpo.force_answer_line_run_on=false",
                                                   "grpo.skip_zero_advantage=false", "ewc.clip_penalty=true"])
    opts = engine_options(cfg)
    same = [f.name for f in dataclasses.fields(EngineOptions) if hasattr(cfg.grpo, f.name)]
    assert {"force_answer_line", "force_answer_line_loss", "force_answer_line_run_on", "skip_zero_advantage",
            "stop_at_answer"} <= set(same)
    assert opts.force_answer_line_run_on is False
    for name in same:
        assert getattr(opts, name) == getattr(cfg.grpo, name), name
    kw = trainer_settings(cfg, 0, list(cfg.rewards.weights))
    assert kw["ewc_clip_penalty"] is True  # the config's flag, the same way round
    off = load_config("tests/configs/tiny.yaml", ["ewc.clip_penalty=false"])
    assert trainer_settings(off, 0, list(off.rewards.weights))["ewc_clip_penalty"] is False


def test_no_other_module_builds_trls_config_or_the_engine_options():
    """The mapping lives in one module: nothing else in the package constructs GRPOConfig or EngineOptions."""
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[1] / "grpo_app"
    builders = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py")
                      if ("GRPOConfig(" in p.read_text() or "EngineOptions(" in p.read_text()))
    assert builders == ["training/settings.py", "training/trainer.py"], builders  # trainer: its default only


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_a_warm_up_is_applied_with_every_schedule_and_a_stage_may_have_its_own(tmp_path, schedule):
    """grpo.warmup_steps rises from 0 with every schedule (transformers' "constant" ignores a warm-up: the engine
    asks for "constant_with_warmup"); a stage's own warmup_steps wins, blank = the run's. The learning rates are
    those of the scheduler TRL's Trainer builds from these arguments (`Trainer.create_scheduler`'s call)."""
    import torch
    from transformers import get_scheduler

    cfg = load_config("tests/configs/tiny.yaml", [f"grpo.lr_scheduler={schedule}", "grpo.warmup_steps=2",
                                                  "grpo.learning_rate=1e-4", "stages[0].steps=6"])

    def rates(c, k=0):
        args = grpo_args(c, k, tmp_path, "cpu")
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
        sched = get_scheduler(args.lr_scheduler_type, opt, num_warmup_steps=args.get_warmup_steps(args.max_steps),
                              num_training_steps=args.max_steps, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
        out = []
        for _ in range(args.max_steps):  # the rate each optimizer step uses
            out.append(round(opt.param_groups[0]["lr"] / 1e-4, 6))
            opt.step()
            sched.step()
        return out

    assert rates(cfg)[:3] == [0.0, 0.5, 1.0]
    assert rates(load_config("tests/configs/tiny.yaml", [f"grpo.lr_scheduler={schedule}", "grpo.learning_rate=1e-4",
                                                         "stages[0].steps=6"]))[0] == 1.0  # no warm-up: full rate
    own = load_config("tests/configs/tiny.yaml", [f"grpo.lr_scheduler={schedule}", "grpo.warmup_steps=2",
                                                  "grpo.learning_rate=1e-4", "stages[0].steps=6",
                                                  "stages[0].warmup_steps=4"])
    assert own.stage_warmup_steps(0) == 4 and rates(own)[:5] == [0.0, 0.25, 0.5, 0.75, 1.0]
    if schedule == "constant":
        assert rates(cfg)[2:] == [1.0] * 4


def test_a_stage_warm_up_is_checked():
    from grpo_app.core.config import ConfigError

    with pytest.raises(ConfigError, match=r"warmup_steps.*not below the stage's steps"):
        load_config("tests/configs/tiny.yaml", ["stages[0].steps=3", "stages[0].warmup_steps=3"])
    with pytest.raises(ConfigError, match="warmup_steps"):
        load_config("tests/configs/tiny.yaml", ["stages[0].warmup_steps=-1"])
    with pytest.raises(ConfigError, match="warmup_steps"):
        load_config("tests/configs/tiny.yaml", ["grpo.warmup_steps=-1"])
