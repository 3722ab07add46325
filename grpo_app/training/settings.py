"""The one place where a `Config` becomes what training runs with.

* `grpo_args`: TRL's `GRPOConfig` for one stage (the settings TRL has, under TRL's names);
* `engine_options`: the trainer's `EngineOptions` (the settings TRL lacks: the project's sampler, the
  answer-line stop and hint, skipping all-equal groups, length buckets, the optimizer);
* `trainer_settings`: everything else the engine hands `CurriculumGRPOTrainer` for a stage (EWC clipping,
  this stage's reward weights);
* `trackers`: `run.report_to` as TRL's `report_to`.

Derived sizes (completions per step, the micro-batch, accumulation steps) are properties of the config
(`GRPOSettings.generation_batch`, `Config.micro_batch`, `Config.accumulation_steps`) and read from there.
"""

from __future__ import annotations

from pathlib import Path

import torch

from grpo_app.core.config import Config
from grpo_app.training.trainer import EngineOptions


def trackers(cfg: Config) -> list[str]:
    """run.report_to as TRL's `report_to` (validated in config.report_to_errors; 'none' = no tracker)."""
    return [n for n in (str(x).strip().lower() for x in cfg.run.report_to or []) if n and n != "none"]


def grpo_args(cfg: Config, stage_index: int, output_dir: Path, device: str, run_name: str | None = None):
    """TRL's `GRPOConfig` for stage `stage_index`: the config's names, one for one, where TRL has the
    setting (G = `num_generations`, the micro-batch = `per_device_train_batch_size`, ...); the settings TRL
    lacks go to `engine_options`."""
    from trl import GRPOConfig

    g = cfg.grpo
    micro, accum = cfg.micro_batch, cfg.accumulation_steps
    stage = cfg.stages[stage_index]
    warmup = cfg.stage_warmup_steps(stage_index)
    return GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum,
        num_generations=g.num_generations,
        max_completion_length=g.max_completion_length,
        max_steps=stage.steps,
        learning_rate=stage.learning_rate if stage.learning_rate is not None else g.learning_rate,  # (per stage)
        # (transformers' "constant" ignores warmup_steps: with a warm-up it is "constant_with_warmup")
        lr_scheduler_type="constant_with_warmup" if g.lr_scheduler == "constant" and warmup else g.lr_scheduler,
        warmup_steps=warmup,  # (per stage)
        weight_decay=g.weight_decay,
        max_grad_norm=g.max_grad_norm if g.max_grad_norm > 0 else 1e9,
        beta=stage_trl_beta(cfg, stage_index),  # (per stage; per row with replay_beta: trainer.py, 10)
        epsilon=g.epsilon,
        loss_type=g.loss_type,
        scale_rewards=g.scale_rewards,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k or None,
        num_iterations=1,
        bf16=device == "cuda" and (cfg.model.dtype == "bfloat16" or (cfg.model.dtype == "auto" and _cuda_bf16())),
        fp16=False,
        use_cpu=device == "cpu",
        activation_checkpointing=False,  # the engine's own layer recompute instead (prepare_model); the old
        # name, gradient_checkpointing, is a deprecated alias that warns on every stage (TRL defaults it on)
        logging_steps=cfg.run.log_every,
        save_strategy="steps" if cfg.run.save_every else "no",
        save_steps=cfg.run.save_every or 10**9,
        report_to=trackers(cfg),
        run_name=run_name,
        seed=cfg.run.seed + stage_index,
        data_seed=cfg.run.seed + stage_index,
        disable_tqdm=True,
        log_completions=False,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        shuffle_dataset=g.shuffle_prompts and not stage.replay,  # (a replay stage is in training order: data.with_replay)
        optim="adamw_torch",
    )


def stage_reward_weights(cfg: Config, k: int, names: list[str]) -> list[float]:
    """The weights of the reward functions `names` in stage k: the stage's own `reward_weights` where it names
    one, else rewards.weights."""
    own = cfg.stages[k].reward_weights or {}
    return [float(own.get(n, cfg.rewards.weights[n])) for n in names]


def _cuda_bf16() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def engine_options(cfg: Config) -> EngineOptions:
    """The trainer's options beyond TRL's `GRPOConfig`, from the config (same names where the config has them)."""
    g = cfg.grpo
    return EngineOptions(
        fast_generation=g.fast_generation,
        packed_sampling=g.packed_sampling,
        stop_at_answer=g.stop_at_answer,
        share_prompt_prefix=g.share_prompt_prefix,
        skip_zero_advantage=g.skip_zero_advantage,
        bucket_lengths=g.bucket_lengths,
        force_answer_line=g.force_answer_line,
        force_answer_line_loss=g.force_answer_line_loss,
        force_answer_line_run_on=g.force_answer_line_run_on,
        top_k=g.top_k,
        recent_samples=max(cfg.ewc.fisher_samples * 4, 64),
        optimizer=g.optimizer,
        merge_lora=cfg.model.lora_merge_for_generation,
    )


def stage_trl_beta(cfg: Config, k: int) -> float:
    """TRL's `beta` for stage k: the stage's own KL coefficient, or, when only its replayed problems have one,
    theirs (TRL builds the reference model and its log-probabilities only when `beta` is not 0; the trainer
    then applies each row's own coefficient, `kl_rows`)."""
    own = cfg.stage_beta(k)
    return own if own > 0 else (cfg.stage_replay_beta(k) if cfg.stage_has_kl(k) else 0.0)


def kl_rows(cfg: Config, k: int, replayed_ids) -> dict | None:
    """`CurriculumGRPOTrainer`'s `kl_rows` for stage k: None when every row has the stage's KL coefficient, else
    {"own": its beta, "replayed": its replay_beta, "ids": the problem ids replayed from earlier stages}."""
    own, replayed = cfg.stage_beta(k), cfg.stage_replay_beta(k)
    if own == replayed or not replayed_ids:
        return None
    return {"own": own, "replayed": replayed, "ids": frozenset(replayed_ids)}


def trainer_settings(cfg: Config, k: int, reward_names: list[str]) -> dict:
    """Keyword arguments of `CurriculumGRPOTrainer` that come from the config, for stage k."""
    return {
        "engine_options": engine_options(cfg),
        "ewc_clip_penalty": cfg.ewc.clip_penalty,
        "reward_weights": stage_reward_weights(cfg, k, reward_names),
    }
