"""Lean MLP / RMSNorm: same outputs and gradients as HF's modules, fewer bytes kept for backward."""

import copy

import pytest
import torch

from grpo_app.lean import make_lean

from .conftest import make_tiny


def saved_bytes(model, ids) -> tuple[int, torch.Tensor]:
    """Bytes of distinct activation tensors (weights excluded) autograd keeps for backward in the layers."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model.model(input_ids=ids).last_hidden_state.pow(2).mean()
    return sum(seen.values()), loss


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lean_modules_match_hf_and_keep_fewer_activations(tokenizer, arch):
    plain = make_tiny(tokenizer, arch).train()
    plain.get_input_embeddings().weight.requires_grad_(False)
    lean = copy.deepcopy(plain)
    counts = make_lean(lean)
    n_layers = plain.config.num_hidden_layers
    assert counts == {"mlp": n_layers, "norm": 2 * n_layers + 1}
    ids = torch.randint(5, len(tokenizer), (3, 40), generator=torch.Generator().manual_seed(0))
    bytes_plain, loss_plain = saved_bytes(plain, ids)
    bytes_lean, loss_lean = saved_bytes(lean, ids)
    torch.testing.assert_close(loss_lean, loss_plain, rtol=1e-5, atol=1e-6)
    loss_plain.backward()
    loss_lean.backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), lean.named_parameters()):
        if a.requires_grad:
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
    print(arch, bytes_lean / bytes_plain)
    assert bytes_lean < 0.75 * bytes_plain, (bytes_lean, bytes_plain)
    with torch.no_grad():  # inference takes the modules' own forward
        torch.testing.assert_close(lean(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_lean_leaves_lora_and_other_modules_alone(tokenizer):
    from grpo_app.config import ModelConfig
    from grpo_app.models import apply_lora

    model = make_tiny(tokenizer)
    lora = apply_lora(model, ModelConfig(lora=True, lora_r=4, lora_target_modules=["gate_proj", "up_proj"]))
    counts = make_lean(lora)
    assert counts["mlp"] == 0 and counts["norm"] == 2 * model.config.num_hidden_layers + 1
    assert make_lean(lora) == {"mlp": 0, "norm": 0}  # idempotent
