"""The CPU shortcuts in CurriculumGRPOTrainer must give TRL's numbers."""

import pytest
import torch
from datasets import Dataset

from grpo_app.core.config import load_config
from grpo_app.core.models import freeze_embeddings
from grpo_app.core.rewards import build_rewards
from grpo_app.core.run_folder import step_record
from grpo_app.training.ewc import EWCState, compute_fisher
from grpo_app.training.lean import layer_hooks, make_lean
from grpo_app.training.sampler import use_fast_attention
from grpo_app.training.settings import grpo_args
from grpo_app.training.trainer import CurriculumGRPOTrainer, EngineOptions, length_buckets, restore_forward

from .conftest import make_tiny


def make_trainer(tmp_path, model, tok, ewc=None, loss_type="dapo", ewc_clip_penalty=False, **opts):
    cfg = load_config("tests/configs/tiny.yaml", [f"grpo.loss_type={loss_type}"])
    funcs, weights = build_rewards(cfg.rewards.weights)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}] * 8)
    tr = CurriculumGRPOTrainer(model=model, processing_class=tok, reward_funcs=funcs,
                               args=grpo_args(cfg, 0, tmp_path, "cpu"), train_dataset=ds, ewc=ewc,
                               ewc_clip_penalty=ewc_clip_penalty, engine_options=EngineOptions(**opts))
    tr.model.train()
    tr.current_gradient_accumulation_steps = tr.args.gradient_accumulation_steps  # set by train() normally
    return tr


def batch(tok, g=3):
    """Two prompts of different lengths (left-padded), g completions each of different lengths (right-padded)."""
    torch.manual_seed(1)
    p1 = torch.randint(10, 400, (5,))
    p2 = torch.randint(10, 400, (8,))
    prompts, pmask, comps, cmask = [], [], [], []
    for p in (p1, p2):
        for j in range(g):
            prompts.append(torch.cat([torch.full((8 - len(p),), tok.pad_token_id), p]))
            pmask.append(torch.cat([torch.zeros(8 - len(p), dtype=torch.long), torch.ones(len(p), dtype=torch.long)]))
            n = 4 + j
            comps.append(torch.cat([torch.randint(10, 400, (n,)), torch.full((6 - n,), tok.pad_token_id)])[:6])
            cmask.append(torch.tensor([1] * min(n, 6) + [0] * (6 - min(n, 6))))
    return torch.stack(prompts), torch.stack(pmask), torch.stack(comps), torch.stack(cmask)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_shared_prefix_logprobs_equal_trl(tmp_path, tokenizer, checkpointing):
    model = make_tiny(tokenizer)
    use_fast_attention(model)
    if checkpointing:  # HF's checkpointed layers drop a KV cache while training: the prompt must not vanish
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    pi, pm, ci, cm = batch(tokenizer)
    ids, mask = torch.cat([pi, ci], 1), torch.cat([pm, cm], 1)
    shared = make_trainer(tmp_path / "a", model, tokenizer, share_prompt_prefix=True)
    lp1, ent1, _ = shared._get_per_token_logps_and_entropies(model, ids, mask, ci.size(1), compute_entropy=True)
    plain = make_trainer(tmp_path / "b", model, tokenizer, share_prompt_prefix=False)
    lp2, ent2, _ = plain._get_per_token_logps_and_entropies(model, ids, mask, ci.size(1), compute_entropy=True)
    torch.testing.assert_close(lp1 * cm, lp2 * cm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ent1 * cm, ent2 * cm, rtol=1e-4, atol=1e-5)
    restore_forward(model)


def _logps_grads_saved(tmp_path, tokenizer, recompute: bool, share: bool = True, calls: list | None = None):
    """Log-probs, every gradient and the bytes autograd keeps (parameters aside) for one shared-prefix pass."""
    model = make_tiny(tokenizer)
    freeze_embeddings(model)
    make_lean(model)
    use_fast_attention(model)
    if recompute:
        assert layer_hooks(model, recompute=True, trim_every=0) == model.config.num_hidden_layers
    pi, pm, ci, cm = batch(tokenizer)
    ids, mask = torch.cat([pi, ci], 1), torch.cat([pm, cm], 1)
    tr = make_trainer(tmp_path, model, tokenizer, share_prompt_prefix=share)
    if calls is not None:
        orig = tr._shared_prefix_logps
        tr._shared_prefix_logps = lambda *a, **k: calls.append(1) or orig(*a, **k)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    saved = [0]

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            saved[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _, _ = tr._get_per_token_logps_and_entropies(model, ids, mask, ci.size(1))
    (lp * cm).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    restore_forward(model)
    return lp * cm, grads, saved[0]


def test_layer_recompute_keeps_the_shared_prefix_and_gives_the_same_gradients(tmp_path, tokenizer):
    calls = []
    lp0, g0, saved0 = _logps_grads_saved(tmp_path / "a", tokenizer, recompute=False)
    lp1, g1, saved1 = _logps_grads_saved(tmp_path / "b", tokenizer, recompute=True, calls=calls)
    assert calls, "the shared-prefix path must stay on with layer recompute"
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=0)
    assert g0.keys() == g1.keys() and len(g0) > 10
    for n in g0:  # the recompute runs the same kernels on the same inputs: bit-identical
        torch.testing.assert_close(g1[n], g0[n], rtol=0, atol=0)
    # Only each layer's input stays for backward (2 layers, tiny widths): a fraction of the activations.
    assert saved1 < saved0 / 3, (saved1, saved0)


@pytest.mark.parametrize("recompute", [False, True])
def test_shared_prefix_gradients_equal_trl_and_each_prompt_is_held_once(tmp_path, tokenizer, monkeypatch, recompute):
    """The gradients of the shared-prefix pass are TRL's (its plain path: every row runs its own prompt); the
    completions' cache layers hold each distinct prompt's keys/values once (two prompts for six rows)."""
    import grpo_app.training.trainer as T

    held = []

    class Recording(T.PrefixLayer):
        def __init__(self, keys, values, rows=None):
            held.append((keys.size(0), None if rows is None else sorted(rows.tolist())))
            super().__init__(keys, values, rows)

    monkeypatch.setattr(T, "PrefixLayer", Recording)
    lp0, g0, _ = _logps_grads_saved(tmp_path / "a", tokenizer, recompute=recompute, share=False)
    assert not held
    lp1, g1, _ = _logps_grads_saved(tmp_path / "b", tokenizer, recompute=recompute)
    assert held and all(h == (2, [0, 0, 0, 1, 1, 1]) for h in held), held
    torch.testing.assert_close(lp1, lp0, rtol=1e-4, atol=1e-5)
    assert g0.keys() == g1.keys() and len(g0) > 10
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-5)


def test_layer_recompute_drops_a_cache_that_is_not_replay_safe(tokenizer):
    """A growing cache (HF's DynamicCache) would get each recomputed layer's keys appended a second time in
    backward; such a cache is dropped for the training forward, as HF's checkpointing does."""
    from transformers import DynamicCache

    ids = torch.randint(10, 400, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding: the attention takes an explicit mask sized for this pass's keys
    results = []
    for recompute in (False, True):
        model = make_tiny(tokenizer)
        freeze_embeddings(model)
        if recompute:
            layer_hooks(model, recompute=True, trim_every=0)
        model.train()
        logits = model(input_ids=ids, attention_mask=mask, past_key_values=DynamicCache(), use_cache=True).logits
        logits[1:].pow(2).mean().backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=0, atol=0)
    for n, g in results[0][1].items():
        torch.testing.assert_close(results[1][1][n], g, rtol=0, atol=0)


def counted_folds(monkeypatch) -> list:
    """The parameters whose alias gradient trainer._fold_grad folds in, one entry per fold, from now on."""
    import grpo_app.training.trainer as T

    folds = []
    fold = T._fold_grad
    monkeypatch.setattr(T, "_fold_grad", lambda p, a: folds.append(p) or fold(p, a))
    return folds


def lean_tiny(tokenizer, recompute: bool):
    """A tiny model set up as the engine trains it: frozen embeddings, lean MLP/norm, fast attention, and
    layer recompute if asked."""
    model = make_tiny(tokenizer)
    freeze_embeddings(model)
    make_lean(model)
    use_fast_attention(model)
    if recompute:
        layer_hooks(model, recompute=True, trim_every=0)
    return model


@pytest.mark.parametrize("recompute", [False, True])
def test_prompt_pass_gradients_are_folded_in_as_they_are_produced(tmp_path, tokenizer, monkeypatch, recompute):
    """Two accumulated micro-batches through the shared-prefix path give TRL's gradients, and the prompt pass's
    contribution reaches each weight through its alias (folded once per micro-batch), so autograd never
    buffers a second set of weight gradients."""
    folds = counted_folds(monkeypatch)
    pi, pm, ci, cm = batch(tokenizer)
    ids, mask = torch.cat([pi, ci], 1), torch.cat([pm, cm], 1)
    grads = []
    for share in (True, False):
        model = lean_tiny(tokenizer, recompute)
        tr = make_trainer(tmp_path / str(share), model, tokenizer, share_prompt_prefix=share)
        for half in (slice(0, 3), slice(3, 6)):  # one group per micro-batch, gradients accumulate
            lp, _, _ = tr._get_per_token_logps_and_entropies(model, ids[half], mask[half], ci.size(1))
            (lp * cm[half]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        restore_forward(model)
        if share:
            trainable = [p for p in model.parameters() if p.requires_grad]
            # The prompt pass reaches every weight up to the last layer's keys/values (not the final norm,
            # nor the last layer's attention output and MLP): each of those is folded once per micro-batch.
            folded = {id(p) for p in folds}
            assert len(folds) == 2 * len(folded) and folded <= {id(p) for p in trainable}
            first, last = model.model.layers[0], model.model.layers[-1]
            assert {id(first.mlp.gate_proj.weight), id(last.self_attn.k_proj.weight)} <= folded
            assert id(last.mlp.down_proj.weight) not in folded
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-6)


def _bucket_cost(buckets, lengths, overhead):
    return sum(len(b) * max(lengths[i] for i in b) + overhead for b in buckets) - overhead


def test_length_buckets_find_the_cheapest_split():
    """Against every split of the sorted rows into consecutive runs (brute force): the same cost, and every
    row exactly once."""
    import itertools
    import random

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 8)
        lengths = [rng.randint(2, 40) for _ in range(n)]
        overhead = rng.choice([0, 3, 16, 64])
        got = length_buckets(lengths, overhead)
        assert sorted(i for b in got for i in b) == list(range(n))
        srt = sorted(lengths)
        best = min(
            sum((b - a) * srt[b - 1] + overhead for a, b in zip((0, *cuts), (*cuts, n))) - overhead
            for k in range(n)
            for cuts in itertools.combinations(range(1, n), k)
        )
        assert _bucket_cost(got, lengths, overhead) == best
    assert length_buckets([5, 9, 7], 1000) == [[0, 2, 1]]  # one bucket when another costs too much
    assert length_buckets([30, 3, 3, 30], 0) == [[1, 2], [0, 3]]


def uneven_batch(tok):
    """Two prompts (left-padded), four completions each of lengths 1 to 12 (right-padded to 12)."""
    torch.manual_seed(2)
    prompts, pmask, comps, cmask = [], [], [], []
    for plen, lens in ((5, (1, 3, 12, 11)), (8, (2, 2, 7, 12))):
        p = torch.randint(10, 400, (plen,))
        for n in lens:
            prompts.append(torch.cat([torch.full((8 - plen,), tok.pad_token_id), p]))
            pmask.append(torch.tensor([0] * (8 - plen) + [1] * plen))
            comps.append(torch.cat([torch.randint(10, 400, (n,)), torch.full((12 - n,), tok.pad_token_id)]))
            cmask.append(torch.tensor([1] * n + [0] * (12 - n)))
    return torch.stack(prompts), torch.stack(pmask), torch.stack(comps), torch.stack(cmask)


@pytest.mark.parametrize("recompute", [False, True])
def test_length_buckets_give_the_same_logprobs_and_gradients_on_fewer_positions(tmp_path, tokenizer, monkeypatch,
                                                                                 recompute):
    """Completions run in buckets cut to their longest row give the one padded pass's log-probs, entropies and
    gradients (two accumulated micro-batches), through fewer positions; every bucket but the last folds its
    weight gradients in through aliases."""
    folds = counted_folds(monkeypatch)
    pi, pm, ci, cm = uneven_batch(tokenizer)
    ids, mask = torch.cat([pi, ci], 1), torch.cat([pm, cm], 1)
    runs = []
    for bucket in (True, False):
        folds.clear()
        model = lean_tiny(tokenizer, recompute)
        positions = []
        model.model.embed_tokens.register_forward_hook(lambda m, a, out, positions=positions: positions.append(a[0].numel()))
        tr = make_trainer(tmp_path / str(bucket), model, tokenizer, bucket_lengths=bucket, bucket_overhead=0)
        lps, ents = [], []
        for half in (slice(0, 4), slice(4, 8)):
            lp, ent, _ = tr._get_per_token_logps_and_entropies(model, ids[half], mask[half], ci.size(1),
                                                               compute_entropy=True)
            (lp * cm[half]).sum().backward()
            lps.append(lp.detach() * cm[half])
            ents.append(ent.detach() * cm[half])
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        runs.append((torch.cat(lps), torch.cat(ents), grads, sum(positions), len(positions), len(folds)))
        restore_forward(model)
    (lp1, ent1, g1, pos1, calls1, folds1), (lp0, ent0, g0, pos0, calls0, folds0) = runs
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent1, ent0, rtol=1e-5, atol=1e-6)
    assert g1.keys() == g0.keys() and len(g0) > 10
    for n in g0:  # (other summation orders round differently: up to 4.3e-6 apart on an AMD EPYC host)
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-5)
    # Unbucketed: one prompt pass and one suffix pass of 4 x 13 positions per micro-batch. Bucketed with no
    # overhead, lengths 2,4,13,12 and 3,3,8,13 (last prompt token included) run as 2|4|12|13 and 3,3|8|13.
    assert calls0 == 4 and calls1 == 2 + 7
    pos_prompts = pos0 - 2 * 4 * 13
    assert pos1 - pos_prompts == (2 + 4 + 12 + 13) + (2 * 3 + 8 + 13)
    # All buckets but each micro-batch's last run on aliases: every trainable weight folded 3 + 2 times more.
    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    assert folds1 - folds0 == (3 + 2) * trainable


def test_replay_safe_cache_layers_return_the_same_keys_when_called_twice():
    from grpo_app.training.trainer import PrefixLayer, PromptRecordLayer

    k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    rec = PromptRecordLayer()
    assert rec.get_seq_length() == 0
    assert rec.update(k, v)[0] is k and rec.update(k * 2, v * 2)[0].equal(k * 2)
    assert rec.keys is k and rec.get_seq_length() == 5  # the first call is the one kept
    pre = PrefixLayer(k.expand(3, -1, -1, -1), v.expand(3, -1, -1, -1))
    nk, nv = torch.randn(3, 2, 2, 4), torch.randn(3, 2, 2, 4)
    a, b = pre.update(nk, nv), pre.update(nk, nv)
    assert a[0].shape == (3, 2, 7, 4) and a[0].equal(b[0]) and a[1].equal(b[1])
    assert pre.get_seq_length() == 5 and pre.get_mask_sizes(2) == (7, 0)


def test_prefix_layer_with_rows_copies_each_prompt_per_row_inside_update():
    """Two distinct prompts held once, three rows continuing them: the same keys/values (and gradients back to
    the prompts') as a layer holding the rows' copies, and the same result on a second call (recompute)."""
    from grpo_app.training.trainer import PrefixLayer

    k, v = torch.randn(2, 2, 5, 4, requires_grad=True), torch.randn(2, 2, 5, 4, requires_grad=True)
    rows = torch.tensor([1, 0, 1])
    nk, nv = torch.randn(3, 2, 2, 4), torch.randn(3, 2, 2, 4)
    held = PrefixLayer(k, v, rows)
    copied = PrefixLayer(k.index_select(0, rows), v.index_select(0, rows))
    a, b, again = held.update(nk, nv), copied.update(nk, nv), held.update(nk, nv)
    assert a[0].shape == (3, 2, 7, 4) and a[0].equal(b[0]) and a[1].equal(b[1]) and a[0].equal(again[0])
    assert a[0][0, :, :5].equal(k[1].detach()) and a[0][1, :, :5].equal(k[0].detach())
    w = torch.randn(3, 2, 7, 4)
    ga = torch.autograd.grad(((a[0] + a[1]) * w).sum(), (k, v))
    gb = torch.autograd.grad(((b[0] + b[1]) * w).sum(), (k, v))
    assert all(x.equal(y) for x, y in zip(ga, gb))
    assert held.get_seq_length() == 5 and held.get_mask_sizes(2) == (7, 0)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_skipping_zero_advantage_rows_gives_identical_gradients(tmp_path, tokenizer, loss_type):
    pi, pm, ci, cm = batch(tokenizer)
    inputs = {"prompt_ids": pi, "prompt_mask": pm, "completion_ids": ci, "completion_mask": cm,
              "advantages": torch.tensor([0.0, 1.2, -1.2, 0.0, 0.0, 0.0]), "num_items_in_batch": cm.sum()}
    grads = []
    for skip in (True, False):
        model = make_tiny(tokenizer)
        freeze_embeddings(model)
        tr = make_trainer(tmp_path / str(skip), model, tokenizer, loss_type=loss_type, skip_zero_advantage=skip)
        loss = tr._compute_loss(model, dict(inputs))
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        if skip:
            assert tr._metrics["train"]["skipped_zero_advantage"] == [4 / 6]
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-7)


def test_all_zero_advantages_still_give_a_differentiable_zero_loss(tmp_path, tokenizer):
    model = make_tiny(tokenizer)
    pi, pm, ci, cm = batch(tokenizer)
    tr = make_trainer(tmp_path, model, tokenizer)
    inputs = {"prompt_ids": pi, "prompt_mask": pm, "completion_ids": ci, "completion_mask": cm,
              "advantages": torch.zeros(6), "num_items_in_batch": cm.sum()}
    loss = tr._compute_loss(model, inputs)
    assert loss.item() == 0.0
    loss.backward()


def moved_from_anchor(tokenizer, lam):
    """A tiny model with a Fisher and anchor from one sample, then every trainable weight moved by 0.01."""
    model = make_tiny(tokenizer)
    freeze_embeddings(model)
    fisher, _ = compute_fisher(model, [([1, 2, 3], [4, 5])])
    ewc = EWCState(lam=lam)
    ewc.consolidate(model, fisher)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01)
    return model, ewc


def test_ewc_penalty_is_added_once_per_optimizer_step(tmp_path, tokenizer):
    model, ewc = moved_from_anchor(tokenizer, 100.0)
    pi, pm, ci, cm = batch(tokenizer)
    inputs = {"prompt_ids": pi, "prompt_mask": pm, "completion_ids": ci, "completion_mask": cm,
              "advantages": torch.zeros(6), "num_items_in_batch": cm.sum()}
    tr = make_trainer(tmp_path, model, tokenizer, ewc=ewc)
    first = tr._compute_loss(model, dict(inputs))
    second = tr._compute_loss(model, dict(inputs))  # same optimizer step: no second penalty
    expected = ewc.penalty_value(model)
    assert expected > 0
    assert first.item() == pytest.approx(expected, rel=1e-5) and second.item() == 0.0
    assert tr._metrics["train"]["ewc_penalty"] == [pytest.approx(expected, rel=1e-5)]


def test_bf16_moment_adamw_tracks_torch_adamw():
    from grpo_app.training.optim import AdamWBF16Moments

    torch.manual_seed(0)
    w1 = torch.nn.Parameter(torch.randn(64, 32))
    w2 = torch.nn.Parameter(w1.detach().clone())
    o1 = torch.optim.AdamW([w1], lr=1e-2, weight_decay=0.1)
    o2 = AdamWBF16Moments([w2], lr=1e-2, weight_decay=0.1)
    start = w1.detach().clone()
    for _ in range(20):
        g = torch.randn(64, 32)
        w1.grad, w2.grad = g.clone(), g.clone()
        o1.step()
        o2.step()
    moved = (w1.detach() - start).abs().mean()
    assert moved > 1e-2
    assert (w1.detach() - w2.detach()).abs().max() < 0.02 * moved.item() * 20  # bf16 rounding of moments only
    assert o2.state[w2]["exp_avg"].dtype == torch.bfloat16
    sd = o2.state_dict()
    o3 = AdamWBF16Moments([torch.nn.Parameter(w2.detach().clone())], lr=1e-2)
    o3.load_state_dict(sd)
    assert o3.state_dict()["state"][0]["exp_avg"].dtype == torch.bfloat16


@pytest.mark.parametrize("after_clip", [True, False])
def test_penalty_gradient_reaches_the_update_with_or_without_clipping_it(tmp_path, tokenizer, after_clip):
    """One real optimizer step away from the anchor with zero advantages (no policy gradient): the update is
    driven by the penalty alone. After clipping (default) the applied gradient is exactly lambda*F*(theta-theta*);
    inside the clip it is rescaled to max_grad_norm."""
    model, ewc = moved_from_anchor(tokenizer, 1e4)
    expected = {n: (p.detach() - ewc.anchor[n]) * ewc.fisher[n] * ewc.lam for n, p in model.named_parameters()
                if n in ewc.anchor}
    tr = make_trainer(tmp_path, model, tokenizer, ewc=ewc, ewc_clip_penalty=not after_clip)
    tr.create_optimizer()
    seen = {}
    tr.optimizer.register_step_pre_hook(  # registered after the EWC hook: sees the gradient the update uses
        lambda opt, a, k: seen.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    )
    pi, pm, ci, cm = batch(tokenizer)
    inputs = {"prompt_ids": pi, "prompt_mask": pm, "completion_ids": ci, "completion_mask": cm,
              "advantages": torch.zeros(6), "num_items_in_batch": cm.sum()}
    loss = tr._compute_loss(model, inputs)
    assert loss.item() == pytest.approx(ewc.penalty_value(model), rel=1e-5)  # reported with the loss either way
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    tr.optimizer.step()
    big = max(expected, key=lambda n: expected[n].norm())
    if after_clip:
        assert norm.item() == 0.0  # nothing to clip: the policy gradient is 0 and the penalty comes later
        for n, g in expected.items():
            torch.testing.assert_close(seen[n], g, rtol=1e-5, atol=1e-12)
    else:
        assert norm.item() > 1.0  # the penalty's gradient was clipped down to norm 1
        total = torch.sqrt(sum(seen[n].pow(2).sum() for n in expected))
        assert total.item() == pytest.approx(1.0, rel=1e-3)
    moved = (model.get_parameter(big).detach() - before[big]) * (before[big] - ewc.anchor[big])
    assert moved.sum() < 0  # the update pulls back toward the anchor
    assert tr._metrics["train"]["ewc_seconds"] and len(tr._metrics["train"]["ewc_seconds"]) == 1


def test_trainer_args_turn_hf_checkpointing_off_without_the_deprecation_warning(tmp_path):
    """TRL defaults `gradient_checkpointing` on; the engine's own layer recompute replaces it. Setting the
    old name warned (FutureWarning) on every stage; the args must say 'off' under both names, quietly."""
    import warnings

    cfg = load_config("tests/configs/tiny.yaml", [])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = grpo_args(cfg, 0, tmp_path, "cpu")
    assert args.activation_checkpointing is False and args.gradient_checkpointing is False


def test_forced_answer_line_reaches_the_sampler_and_its_share_is_logged(tmp_path, tokenizer):
    """The trainer hands `force_answer_line` to the sampler: with every token an end token, each completion
    ends at once, is given "\\n####", and ends at the next token (once only); the share is logged."""
    from grpo_app.training.sampler import answer_line_start

    start = answer_line_start(tokenizer)
    for share, expected in ((1.0, 1.0), (0.0, None)):
        model = make_tiny(tokenizer)
        tr = make_trainer(tmp_path / str(share), model, tokenizer, force_answer_line=share)
        tr.eos_token_ids = list(range(len(tokenizer)))  # any sampled token ends the completion
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], add_generation_prompt=True,
                                               tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        ids, _ = tr._generate_single_turn([prompt] * 4, None, None, 4)
        logged = tr._metrics["train"].get("gen/forced_answer_line")
        if expected is None:  # each ends at its first token, which is kept: the end token is trained (departure 1)
            assert [len(c) for c in ids] == [1] * 4 and not logged
        else:  # the forced line, then the end token sampled after it
            assert [c[:-1] for c in ids] == [start] * 4 and all(len(c) == len(start) + 1 for c in ids)
            assert logged == [expected]


def test_the_sampled_end_token_is_in_the_loss_and_a_completion_of_just_an_end_token_trains(tmp_path, tokenizer):
    """Departure 1: as in TRL, a completion keeps the end token it sampled, so the loss covers it and the model
    learns when to stop. Every token counts as an end token here, so each completion is its end token alone
    (it used to come back empty, and TRL's step indexed `ids[-1]` of an empty list)."""
    model = make_tiny(tokenizer)
    freeze_embeddings(model)
    tr = make_trainer(tmp_path, model, tokenizer)
    tr.eos_token_ids = list(range(len(tokenizer)))
    rows = [{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}] * 4
    out = tr._generate_and_score_completions(rows)
    ids, mask = out["completion_ids"], out["completion_mask"]
    assert ids.shape[1] == 1 and mask.tolist() == [[1]] * 4  # one token each, in the loss
    inputs = {**out, "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])}
    tr._compute_loss(model, inputs).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0  # the end tokens alone moved the weights
    tr.args.max_steps = 1  # and a whole step of TRL's loop on such completions runs
    tr.train()
    assert tr.state.global_step == 1


@pytest.mark.parametrize("mode", ["train", "mask"])
def test_forced_hint_is_marked_in_the_step_record_and_masked_out_of_the_loss_on_request(tmp_path, tokenizer, mode):
    """Departure 8: every completion ends at once, gets the hint "\\n####" and ends after one more sampled token.
    The step record marks the hint's span; with force_answer_line_loss = mask the hint's tokens carry no gradient,
    checked against log-probs computed here with a plain forward pass."""
    from grpo_app.training.sampler import answer_line_start

    start = answer_line_start(tokenizer)
    n = len(start)
    model = make_tiny(tokenizer)
    freeze_embeddings(model)
    tr = make_trainer(tmp_path, model, tokenizer, force_answer_line=1.0, force_answer_line_loss=mode)
    tr.eos_token_ids = list(range(len(tokenizer)))
    snaps = []
    tr.on_group = snaps.append
    rows = [{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2", "question": "1+1?"}] * 4
    out = tr._generate_and_score_completions(rows)
    ids = out["completion_ids"]
    assert ids.shape[1] == n + 1 and ids[:, :n].tolist() == [start] * 4
    if mode == "mask":
        assert out["tool_mask"].tolist() == [[0] * n + [1]] * 4
    else:
        assert "tool_mask" not in out
    tr._emit_groups(rows)
    g = snaps[0]["groups"][0]
    assert snaps[0]["forced_loss"] == mode and len(g["forced"]) == 4
    assert all(g["completions"][i][a:b] == "\n####" for i, (a, b) in enumerate(g["forced"]))
    rec = step_record({**snaps[0], "step": 1, "stage": 0})  # what steps.jsonl keeps of it
    assert rec["forced_loss"] == mode and rec["groups"][0]["forced"] == [list(s) for s in g["forced"]]

    adv = torch.tensor([1.0, -1.0, 0.5, -0.25])
    tr._compute_loss(model, {**out, "advantages": adv}).backward()
    got = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    p_len = out["prompt_ids"].shape[1]  # the four prompts are one: no padding
    full = torch.cat([out["prompt_ids"], ids], 1)
    logp = torch.log_softmax(model(input_ids=full).logits[:, p_len - 1 : -1].float(), -1)
    logp = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)  # [4, n + 1]: the hint's n tokens, then the end token
    in_loss = torch.tensor([0.0] * n + [1.0]) if mode == "mask" else torch.ones(n + 1)
    (-(adv[:, None] * logp * in_loss).sum() / (4 * in_loss.sum())).backward()  # dapo: over the tokens in the loss
    want = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys() and got
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6)


def test_skipping_zero_advantage_rows_with_a_tool_mask_gives_identical_gradients(tmp_path, tokenizer):
    """With force_answer_line_loss = mask the loss carries TRL's tool_mask; the skip of zero-advantage rows
    (departure 4) must still give the full pass's gradients, for bnpo's normalizer too."""
    pi, pm, ci, cm = batch(tokenizer)
    tm = torch.ones_like(cm)
    tm[:, 1:3] = 0
    inputs = {"prompt_ids": pi, "prompt_mask": pm, "completion_ids": ci, "completion_mask": cm, "tool_mask": tm,
              "advantages": torch.tensor([0.0, 1.2, -1.2, 0.0, 0.0, 0.7]), "num_items_in_batch": (cm * tm).sum()}
    for loss_type in ("dapo", "bnpo", "grpo"):
        grads = []
        for skip in (True, False):
            model = make_tiny(tokenizer)
            freeze_embeddings(model)
            tr = make_trainer(tmp_path / f"{loss_type}{skip}", model, tokenizer, loss_type=loss_type,
                              skip_zero_advantage=skip)
            tr._compute_loss(model, dict(inputs)).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            if skip:
                assert tr._metrics["train"]["skipped_zero_advantage"] == [3 / 6]
        for name in grads[0]:
            torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_a_kl_coefficient_per_row_gives_trl_loss_with_the_kl_on_those_rows_only(tmp_path, tokenizer, loss_type):
    """10. Rows 3-5 (replayed) under beta 0.3, rows 0-2 under 0: the same loss and gradients as TRL's, beta 0.3 on
    every row, with rows 0-2's reference set to the policy itself (their KL term and its gradient then 0)."""
    pi, pm, ci, cm = batch(tokenizer)
    model = make_tiny(tokenizer)
    freeze_embeddings(model)
    tr = make_trainer(tmp_path, model, tokenizer, loss_type=loss_type)
    tr.beta = 0.3
    with torch.no_grad():
        logps = tr._get_per_token_logps_and_entropies(model, torch.cat([pi, ci], 1), torch.cat([pm, cm], 1), ci.size(1))[0]
    torch.manual_seed(2)
    ref = logps + 0.5 * torch.randn_like(logps)
    inputs = {"prompt_ids": pi, "prompt_mask": pm, "completion_ids": ci, "completion_mask": cm,
              "advantages": torch.tensor([0.0, 1.2, -1.2, 0.7, 0.0, -0.7]), "num_items_in_batch": cm.sum()}
    own_rows = torch.tensor([True, True, True, False, False, False])
    results = []
    for per_row in (True, False):
        model.zero_grad(set_to_none=True)
        if per_row:
            given = {**inputs, "ref_per_token_logps": ref, "kl_beta": torch.tensor([0.0, 0, 0, 0.3, 0.3, 0.3])}
        else:
            given = {**inputs, "ref_per_token_logps": torch.where(own_rows[:, None], logps, ref)}
        loss = tr._compute_loss(model, given)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (la, ga), (lb, gb) = results
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-7)
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-7)
    assert tr.beta == 0.3  # TRL's coefficient is put back
    assert tr._metrics["train"]["skipped_zero_advantage"] == [1 / 3]  # the beta-0 part still skips its zero rows


@pytest.mark.parametrize("packed", [True, False])
def test_packed_sampling_reaches_the_sampler(tmp_path, tokenizer, monkeypatch, packed):
    """EngineOptions.packed_sampling (grpo.packed_sampling) is what the trainer's sampling asks packing for."""
    from grpo_app.training import sampler

    asked = []
    real = sampler.packed_linears

    def pack(model, rows, enabled=True):
        asked.append(enabled)
        return real(model, rows, enabled)

    monkeypatch.setattr(sampler, "packed_linears", pack)
    tr = make_trainer(tmp_path, make_tiny(tokenizer), tokenizer, packed_sampling=packed)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    tr._generate_single_turn([prompt] * 4, None, None, 4)
    assert asked == [packed]


def test_a_group_whose_totals_are_all_equal_gets_advantages_of_exactly_zero_and_its_rows_are_skipped(
    tmp_path, tokenizer, monkeypatch
):
    """Departure 4: eight answers that all earn 0.3 + 0.1 have, in TRL's float32 arithmetic, a group mean 3e-8 off
    their total and a std of ~3e-8, so TRL gives each an advantage of about -3e-4 and its `frac_reward_zero_std`
    does not count the group. Here the group's advantages are exactly 0, the share counts it and the training
    pass skips its rows; the group whose totals differ keeps TRL's advantages."""

    def strict(completions, **kw):
        return [1.0] * len(completions)

    def soft(completions, **kw):  # the first group: all 1; the second: 1, 0, 1, 0, ...
        return [1.0] * 8 + [float(i % 2 == 0) for i in range(len(completions) - 8)]

    def run(fix: bool):
        import grpo_app.training.trainer as T

        if not fix:
            monkeypatch.setattr(T.CurriculumGRPOTrainer, "_zero_equal_groups", lambda self, out, n: None)
        else:
            monkeypatch.undo()
        cfg = load_config("tests/configs/tiny.yaml", ["grpo.num_generations=8"])
        model = make_tiny(tokenizer)
        freeze_embeddings(model)
        ds = Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}] * 16)
        tr = CurriculumGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[strict, soft],
                                   reward_weights=[0.3, 0.1], args=grpo_args(cfg, 0, tmp_path / str(fix), "cpu"),
                                   train_dataset=ds, engine_options=EngineOptions())
        tr.model.train()
        tr.current_gradient_accumulation_steps = tr.args.gradient_accumulation_steps
        tr.eos_token_ids = list(range(len(tokenizer)))  # one-token completions: fast
        out = tr._generate_and_score_completions([dict(ds[0])] * 16)
        return tr, model, out

    _, _, trl_out = run(fix=False)
    residue = trl_out["advantages"][:8]
    assert (residue != 0).all() and residue.abs().max() < 1e-2  # TRL's: tiny, not 0 (so this test can fail)
    tr, model, out = run(fix=True)
    adv = out["advantages"]
    assert adv[:8].tolist() == [0.0] * 8
    torch.testing.assert_close(adv[8:], trl_out["advantages"][8:])
    assert adv[8:].abs().min() > 0.5
    assert tr._metrics["train"]["frac_reward_zero_std"][-1] == 0.5
    assert list(tr._logs["advantages"])[:8] == [0.0] * 8  # what the step record shows
    tr._compute_loss(model, out).backward()
    assert tr._metrics["train"]["skipped_zero_advantage"] == [0.5]
