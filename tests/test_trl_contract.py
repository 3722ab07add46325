"""The contract with TRL: CurriculumGRPOTrainer overrides private GRPOTrainer / Trainer methods and reads a few
private attributes. If a TRL upgrade renames one, the override would silently stop being called and the
fast path would be skipped with no error. These tests fail instead:

1. every method the subclass overrides still exists on TRL's class with the parameters the override
   expects (names, in order);
2. the private attributes the overrides read are still set by TRL's constructor;
3. one real optimizer step on a tiny model goes through the project's sampler
   (`generation.generate_completions`, never HF `generate`), its shared-prefix log-prob pass and, on the CPU,
   the LM head that keeps its logits for backward (`lm_head`, which stands in for TRL's fused head function);
4. the TRL names `lm_head` copies or calls still exist.
"""

from __future__ import annotations

import inspect

import pytest
from trl import GRPOTrainer

from grpo_app.training import lm_head
from grpo_app.training import trainer as trainer_mod
from grpo_app.training.trainer import CurriculumGRPOTrainer

from .conftest import make_tiny
from .test_trainer import make_trainer

# Methods the subclass adds (not overrides): everything else it defines must exist on TRL's side.
OWN_METHODS = {
    "_ewc_grad_hook", "_emit_groups", "_shared_prefix_logps", "_create_optimizer", "_set_activity", "_abort_requested",
    "_check_abort", "_forced_span", "_share", "_rows_loss", "_zero_equal_groups",
}


def _overrides() -> list[str]:
    return sorted(
        name
        for name, value in vars(CurriculumGRPOTrainer).items()
        if inspect.isfunction(value) and name not in OWN_METHODS and name != "__init__"
    )


def test_the_list_of_overrides_is_what_the_trainer_documents():
    # A new override must be added to this contract (and to trainer.py's numbered list of departures).
    assert _overrides() == [
        "_compute_loss",
        "_generate",  # 8: the forced hint's tokens get 0 in TRL's tool_mask (force_answer_line_loss = mask)
        "_generate_and_score_completions",  # 4: equal groups' advantages exactly 0; 10: each row's `kl_beta`
        "_generate_single_turn",
        "_get_output_dir",
        "_get_per_token_logps_and_entropies",
        "_prepare_inputs",
        "_save_checkpoint",
        "create_optimizer",
        "training_step",
    ]


@pytest.mark.parametrize("name", _overrides())
def test_trl_still_has_each_overridden_method_with_the_same_parameters(name):
    parent = getattr(GRPOTrainer, name, None)
    assert parent is not None, f"TRL's GRPOTrainer no longer has {name}: the override is dead code"
    sig = inspect.signature(getattr(CurriculumGRPOTrainer, name)).parameters
    ours = [p for p, v in sig.items() if v.kind is not inspect.Parameter.VAR_KEYWORD]
    theirs = list(inspect.signature(parent).parameters)
    if len(ours) < len(sig):  # the override names TRL's leading parameters and passes the rest on as **kwargs
        assert theirs[: len(ours)] == ours, f"{name}: TRL's parameters are {theirs}, the override takes {ours}"
    else:
        assert ours == theirs, f"{name}: TRL's parameters are {theirs}, the override takes {ours}"


def test_the_private_attributes_the_overrides_read_are_still_set(tmp_path, tokenizer):
    tr = make_trainer(tmp_path, make_tiny(tokenizer), tokenizer)
    for attr in ("_step", "_buffered_inputs", "_metrics", "use_vllm", "eos_token_ids", "num_iterations",
                 "max_completion_length", "temperature", "top_p", "_logs", "reward_func_names", "reward_weights"):
        assert hasattr(tr, attr), f"TRL no longer sets self.{attr}, which the trainer's overrides read"
    assert callable(getattr(tr, "_generate_and_score_completions", None))


def test_a_training_step_goes_through_the_project_sampler_and_shared_prefix_pass(tmp_path, tokenizer, monkeypatch):
    model = make_tiny(tokenizer)
    calls = {"sampler": 0, "shared_prefix": 0, "kept_head": 0}

    real_sampler = trainer_mod.generate_completions

    def counting_sampler(*args, **kwargs):
        calls["sampler"] += 1
        return real_sampler(*args, **kwargs)

    def no_hf_generate(*args, **kwargs):
        raise AssertionError("HF generate was called: the project's sampler was bypassed")

    real_shared = CurriculumGRPOTrainer._shared_prefix_logps

    def counting_shared(self, *args, **kwargs):
        calls["shared_prefix"] += 1
        return real_shared(self, *args, **kwargs)

    real_kept = lm_head.KeptTilesLogProb.apply

    def counting_kept(*args, **kwargs):
        calls["kept_head"] += 1
        return real_kept(*args, **kwargs)

    monkeypatch.setattr(lm_head.KeptTilesLogProb, "apply", counting_kept)
    monkeypatch.setattr(trainer_mod, "generate_completions", counting_sampler)
    monkeypatch.setattr(CurriculumGRPOTrainer, "_shared_prefix_logps", counting_shared)
    monkeypatch.setattr(model, "generate", no_hf_generate)
    tr = make_trainer(tmp_path, model, tokenizer, skip_zero_advantage=False)
    tr.args.max_steps = 1
    tr.args.save_strategy = "no"
    tr.train()
    assert tr.state.global_step == 1
    assert calls["sampler"] >= 1, "the step did not sample through generation.generate_completions"
    assert calls["shared_prefix"] >= 1, "the step's log-probs did not go through the shared-prefix pass"
    assert calls["kept_head"] >= 1, "the training pass's LM head did not keep its logits (TRL's head was not routed)"


def test_trl_still_has_the_fused_lm_head_names_lm_head_relies_on():
    import trl.trainer.utils as trl_utils
    from trl.kernels import chunked_logprob

    assert trl_utils._ChunkedLogProbFunction is lm_head._Dispatch  # installed by trainer.py at import
    assert "_ChunkedLogProbFunction.apply(" in inspect.getsource(trl_utils.add_fused_lm_head)
    for name in ("ChunkedLogProbFunction", "_forward_tile", "_backward_tile", "_addmm_fp32", "_use_triton",
                 "TOKEN_CHUNK_SIZE", "OPTIONAL_OUTPUTS"):
        assert hasattr(chunked_logprob, name), name
    assert callable(getattr(trl_utils, "maybe_gather_lm_head_ctx", None))
    # the forward and backward kept-tiles copies: TRL's torch path still projects each tile with torch.mm into a
    # reused buffer and recomputes it in backward (if TRL stops recomputing, this module is not needed)
    src = inspect.getsource(chunked_logprob.ChunkedLogProbFunction.backward)
    assert "torch.mm(hidden_chunk, w_chunk.t(), out=tile)" in src and "_backward_tile" in src


def test_trl_still_builds_its_kl_reference_through_create_model_from_path():
    # Departure 9 hands TRL the stage's reference by standing in for this function while TRL's __init__ runs.
    import trl.trainer.grpo_trainer as grpo_module

    assert callable(getattr(grpo_module, "create_model_from_path", None))
    assert "self.ref_model = create_model_from_path(" in inspect.getsource(GRPOTrainer.__init__)
