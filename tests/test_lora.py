"""LoRA: merged sampling gives the same completions as unmerged sampling, the base weights come back,
and a LoRA run trains its adapters (not the base) through two stages with the EWC penalty."""

import torch

from grpo_app.core.config import ModelConfig
from grpo_app.core.models import apply_lora
from grpo_app.runs.manager import RunManager
from grpo_app.training.sampler import SamplingParams, generate_completions
from grpo_app.training.trainer import lora_merged

from .conftest import make_tiny
from .test_runs import tiny_cfg


def _lora_model(tokenizer):
    model = apply_lora(make_tiny(tokenizer), ModelConfig(lora=True, lora_r=4, lora_alpha=8))
    torch.manual_seed(1)
    with torch.no_grad():  # peft starts B at 0 (a zero delta); give the adapters something to merge
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    return model.eval()


def test_merged_sampling_matches_unmerged_and_restores_the_weights(tokenizer):
    model = _lora_model(tokenizer)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    prompts = [tokenizer("What is 2 + 3?")["input_ids"]] * 2 + [tokenizer("Seven minus four")["input_ids"]] * 2
    params = SamplingParams(max_new_tokens=12, temperature=1.0, stop_at_answer=False, seed=7)

    unmerged = generate_completions(model, tokenizer, prompts, params, eos_token_ids=[-1])
    with lora_merged(model) as m:
        merged_weights = dict(m.named_parameters())
        moved = max((merged_weights[n] - base[n]).abs().max().item() for n in base)
        merged = generate_completions(m, tokenizer, prompts, params, eos_token_ids=[-1])
    assert moved > 1e-3  # the deltas really were in the weights while sampling
    assert merged.completion_ids == unmerged.completion_ids
    after = dict(model.named_parameters())
    assert max((after[n] - base[n]).abs().max().item() for n in base) < 1e-5  # unmerged again
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)

    plain = make_tiny(tokenizer)
    with lora_merged(plain) as m:  # no adapters: nothing to do
        assert m is plain


def test_lora_run_trains_adapters_only_through_two_stages(runs_dir, varied_reward):
    cfg = tiny_cfg(runs_dir, "model.lora=true", "model.lora_r=4", "stages[0].steps=2", "stages[1].steps=2",
                   "grpo.learning_rate=0.01")
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert mgr.wait(600)
    status = run.read_status()
    assert status["status"] == "completed", status.get("error")
    metrics = run.metrics()
    assert [m["stage"] for m in metrics] == [0, 0, 1, 1]
    assert max(m["ewc_penalty"] for m in metrics if m["stage"] == 1) > 0  # Fisher over the adapters
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(run.path / "final", dtype=torch.float32)  # merged, plain model
    assert not any("lora_" in n for n, _ in final.named_parameters())
