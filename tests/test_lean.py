"""Lean MLP / RMSNorm: same outputs and gradients as HF's modules, fewer bytes kept for backward."""

import copy

import pytest
import torch

from grpo_app.training.lean import layer_hooks, make_lean

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
    from grpo_app.core.config import ModelConfig
    from grpo_app.core.models import apply_lora

    model = make_tiny(tokenizer)
    lora = apply_lora(model, ModelConfig(lora=True, lora_r=4, lora_target_modules=["gate_proj", "up_proj"]))
    counts = make_lean(lora)
    assert counts["mlp"] == 0 and counts["norm"] == 2 * model.config.num_hidden_layers + 1
    assert make_lean(lora) == {"mlp": 0, "norm": 0}  # idempotent


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cpu_attention_keeps_kv_heads_unrepeated_with_same_gradients(tokenizer, arch):
    """Training attention through the project's attention function attends on the KV heads directly
    (no repeat_kv copies kept for backward) and gives HF SDPA's outputs and gradients, with a padding
    mask and a cached prompt prefix (the shape the trainer's shared-prefix log-probs use)."""
    from transformers import DynamicCache

    from grpo_app.training.sampler import use_fast_attention

    plain = make_tiny(tokenizer, arch).train()
    plain.set_attn_implementation("sdpa")
    ours = copy.deepcopy(plain)
    use_fast_attention(ours)
    cfg = plain.config
    assert cfg.num_attention_heads > cfg.num_key_value_heads  # a grouped-query model
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(5, len(tokenizer), (2, 12), generator=gen)
    suffix = torch.randint(5, len(tokenizer), (4, 9), generator=gen)
    mask = torch.ones(4, 21, dtype=torch.long)
    mask[0, :3] = 0  # left padding in the prompt of rows 0-1
    mask[1, :3] = 0
    mask[3, -2:] = 0  # right padding at the end of a completion
    rows = torch.tensor([0, 0, 1, 1])

    def run(model):
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        shapes = []

        def pack(t):
            if t.untyped_storage().data_ptr() not in weights:
                shapes.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            cache = DynamicCache()
            model.model(input_ids=prompt, attention_mask=mask[[0, 2], :12], past_key_values=cache, use_cache=True)
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
            out = model(input_ids=suffix, attention_mask=mask, past_key_values=cache).logits
        loss = (out * mask[:, 12:, None]).pow(2).mean()
        loss.backward()
        return out, shapes

    out_plain, shapes_plain = run(plain)
    out_ours, shapes_ours = run(ours)
    valid = mask[:, 12:].bool()
    torch.testing.assert_close(out_ours[valid], out_plain[valid], rtol=1e-5, atol=1e-5)
    for (name, a), (_, b) in zip(plain.named_parameters(), ours.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
    repeated = (4, cfg.num_attention_heads, 21, cfg.head_dim if hasattr(cfg, "head_dim") else cfg.hidden_size // cfg.num_attention_heads)
    assert repeated in shapes_plain  # HF keeps the KV heads repeated per query head ...
    assert repeated not in shapes_ours  # ... this keeps them as they are


def test_layer_hooks_trim_the_heap_as_backward_reaches_every_kth_layer_and_the_top_one(tokenizer, monkeypatch):
    import grpo_app.training.lean as lean

    model = make_tiny(tokenizer)  # 2 layers: indices 0 and 1
    calls = []
    monkeypatch.setattr(lean, "trim_heap", lambda: calls.append(1))
    assert lean.layer_hooks(model, recompute=False, trim_every=1) == 2
    assert lean.layer_hooks(model, recompute=True, trim_every=1) == 0  # already patched: left as it is
    ids = torch.randint(10, 400, (2, 7))
    model.train()
    with torch.no_grad():
        model(input_ids=ids)
    model.eval()
    model(input_ids=ids).logits.sum().backward()
    assert calls == []  # no gradients or not training: nothing registered
    model.train()
    loss = model(input_ids=ids).logits.sum()
    assert calls == []  # nothing in the forward
    loss.backward()
    assert len(calls) == 2  # as backward reaches each layer
    # Every 2nd layer of 4 (0 and 2), and the top one (3), the first that backward reaches; layer 1 left alone.
    other = make_tiny(tokenizer, layers=4)
    assert lean.layer_hooks(other, recompute=False, trim_every=2) == 3
    assert "forward" not in other.model.layers[1].__dict__
    calls.clear()
    other.train()
    other(input_ids=ids).logits.sum().backward()
    assert len(calls) == 3
    assert lean.layer_hooks(make_tiny(tokenizer), recompute=False, trim_every=0) == 0


def test_layer_recompute_keeps_only_layer_inputs_with_the_same_gradients(tokenizer):
    grads, saved = [], []
    for recompute in (False, True):
        model = make_tiny(tokenizer)
        make_lean(model)
        if recompute:
            assert layer_hooks(model, recompute=True, trim_every=0) == model.config.num_hidden_layers
        model.train()
        ids = torch.randint(10, 400, (2, 9))
        n, loss = saved_bytes(model, ids)
        loss.backward()
        saved.append(n)
        grads.append({k: p.grad for k, p in model.named_parameters()})
    assert saved[1] < saved[0] / 3, saved
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=0, atol=0)


@pytest.mark.parametrize("order", ["lean_first", "hooks_first"])
def test_layer_recompute_does_not_redo_the_mlp_down_projection(tokenizer, order):
    """Under layer recompute the lean MLP runs its down projection outside its own function, so torch's
    checkpoint stops each layer's recompute before it: one matrix multiply fewer per layer in backward than the
    whole-MLP function (same gradients), and the same bytes kept. Without recompute the whole-MLP function
    stays (the split would keep silu(g) * u too)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMM(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("mm", "addmm", "bmm"):
                self.n += 1
            return func(*args, **(kwargs or {}))

    ids = torch.randint(10, 400, (2, 9))
    runs = []
    for split in (True, False):
        model = make_tiny(tokenizer)
        if order == "lean_first":
            make_lean(model)
            layer_hooks(model, recompute=True, trim_every=0)
        else:
            layer_hooks(model, recompute=True, trim_every=0)
            make_lean(model)
        mlps = [layer.mlp for layer in model.model.layers]
        assert all(m._grpo_split_down for m in mlps)
        for m in mlps:
            m._grpo_split_down = split
        model.train()
        n, loss = saved_bytes(model, ids)
        with CountMM() as count:
            loss.backward()
        runs.append((count.n, n, {k: p.grad for k, p in model.named_parameters()}))
    (mm_split, saved_split, g_split), (mm_whole, saved_whole, g_whole) = runs
    assert mm_whole - mm_split == model.config.num_hidden_layers, (mm_split, mm_whole)
    assert saved_split == saved_whole
    for k in g_whole:
        torch.testing.assert_close(g_split[k], g_whole[k], rtol=1e-5, atol=1e-7)
    plain = make_tiny(tokenizer)
    make_lean(plain)
    layer_hooks(plain, recompute=False, trim_every=1)
    assert not any(layer.mlp._grpo_split_down for layer in plain.model.layers)


def test_trainable_layers_train_the_top_ones_and_backward_stops_at_the_lowest(tokenizer):
    """model.trainable_layers: the lower layers get no gradient and, with layer recompute, are not run again
    in backward (autograd recorded nothing there); the trained layers' gradients are those of a model that
    trains every layer."""
    from grpo_app.core.models import freeze_embeddings, freeze_lower_layers

    ids = torch.randint(10, 400, (2, 9))
    grads, calls = [], []
    for trainable in (0, 2):
        model = make_tiny(tokenizer, layers=4)
        freeze_embeddings(model)
        assert freeze_lower_layers(model, trainable) == (2 if trainable else 0)
        make_lean(model)
        layer_hooks(model, recompute=True, trim_every=0)
        runs = [0] * 4
        for i, layer in enumerate(model.model.layers):
            # on self_attn: the recompute calls the layer's forward directly, which the layer's own hooks miss
            layer.self_attn.register_forward_hook(lambda m, a, o, i=i, runs=runs: runs.__setitem__(i, runs[i] + 1))
        model.train()
        model(input_ids=ids).logits.pow(2).mean().backward()
        grads.append({k: p.grad for k, p in model.named_parameters()})
        calls.append(runs)
    assert calls[0] == [2, 2, 2, 2]  # every layer: forward, then its recompute in backward
    assert calls[1] == [1, 1, 2, 2]  # frozen layers run once
    for k, g in grads[1].items():
        if k.startswith(("model.layers.0.", "model.layers.1.", "model.embed_tokens")):
            assert g is None, k
        else:
            torch.testing.assert_close(g, grads[0][k], rtol=1e-5, atol=1e-7, msg=k)


def test_trainable_layers_beyond_the_model_are_refused_with_the_count(tokenizer):
    from grpo_app.core.models import ModelError, freeze_lower_layers

    model = make_tiny(tokenizer, layers=4)
    with pytest.raises(ModelError, match=r"trainable_layers=5, but this model has 4 decoder layers; use 1-4"):
        freeze_lower_layers(model, 5)
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen on the way
    assert freeze_lower_layers(model, 4) == 0
