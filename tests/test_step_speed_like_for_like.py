"""bench/step_speed.py's like-for-like setups (issue 46, 3): TRL and the engine are built from one description,
so what they are told agrees field by field; that they then took the same prompts in the same order is checked
by the bench itself from what each side trained on."""

import json

import pytest

from bench.step_speed import COMPLETION, SAME, G, engine_same_config, trl_same_args
from grpo_app.training.settings import grpo_args, stage_reward_weights


@pytest.mark.parametrize("stop", [True, False])
def test_trl_and_the_engine_get_the_same_sampling_rewards_and_prompt_order(tmp_path, stop):
    custom = tmp_path / "same.jsonl"
    custom.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(32)))
    trl = trl_same_args(str(tmp_path / "trl"), steps=1, prompts_per_step=16)
    cfg = engine_same_config(str(custom), 32, steps=1, prompts_per_step=16, stop_at_answer=stop)
    eng = grpo_args(cfg, 0, tmp_path / "engine", "cpu")
    for name in ("temperature", "top_p", "learning_rate", "num_generations", "max_completion_length",
                 "per_device_train_batch_size", "gradient_accumulation_steps", "beta", "shuffle_dataset",
                 "max_steps", "activation_checkpointing", "loss_type", "scale_rewards", "epsilon"):
        assert getattr(eng, name) == getattr(trl, name), name
    assert eng.shuffle_dataset is False and eng.temperature == SAME["temperature"] == 1.0
    assert (eng.num_generations, eng.max_completion_length) == (G, COMPLETION)
    names = list(cfg.rewards.weights)
    assert names == list(SAME["rewards"]) and stage_reward_weights(cfg, 0, names) == trl.reward_weights
    assert cfg.grpo.stop_at_answer is stop and cfg.grpo.force_answer_line == 0 and not cfg.ewc.enabled
    assert not cfg.grpo.gradient_checkpointing  # no recompute, as TRL's checkpointing is off
    assert [s.source for s in cfg.stages] == ["custom"] and cfg.stages[0].num_problems == 32
