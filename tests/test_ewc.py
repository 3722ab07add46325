import types

import pytest
import torch

from grpo_app.training.ewc import EWCState, compute_fisher


class TinyLM(torch.nn.Module):
    """logits at position t = W @ E[token_t]: a model whose gradients are known in closed form."""

    def __init__(self, vocab=5, dim=3):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(vocab, dim, generator=g))
        self.head = torch.nn.Parameter(torch.randn(vocab, dim, generator=g))

    def forward(self, input_ids, **kw):
        return types.SimpleNamespace(logits=self.emb[input_ids] @ self.head.T)


def hand_fisher(m, samples):
    """Closed form: d log softmax(W h)[y] / dW = (onehot(y) - p) h^T; d/dE[x] = W^T (onehot(y) - p)."""
    fe, fh = torch.zeros_like(m.emb), torch.zeros_like(m.head)
    with torch.no_grad():
        for prompt, completion in samples:
            seq = prompt + completion
            ge, gh = torch.zeros_like(m.emb), torch.zeros_like(m.head)
            for t in range(len(prompt) - 1, len(seq) - 1):
                h = m.emb[seq[t]]
                p = torch.softmax(m.head @ h, -1)
                r = -p
                r[seq[t + 1]] += 1
                gh += torch.outer(r, h)
                ge[seq[t]] += m.head.T @ r
            fe += ge**2
            fh += gh**2
    return {"emb": fe / len(samples), "head": fh / len(samples)}


def test_fisher_matches_hand_computation():
    m = TinyLM()
    samples = [([0, 1], [2, 3]), ([4], [1]), ([2, 2], [0, 4, 1])]
    fisher, stats = compute_fisher(m, samples)
    ref = hand_fisher(m, samples)
    for name in ("emb", "head"):
        torch.testing.assert_close(fisher[name], ref[name], rtol=1e-5, atol=1e-7)
    assert stats.samples == 3 and stats.max > 0


def test_fisher_is_mean_of_squared_per_sample_gradients_not_square_of_mean():
    m = TinyLM()
    samples = [([0], [1]), ([0], [2])]
    fisher, _ = compute_fisher(m, samples)
    one = [compute_fisher(m, [s])[0]["head"] for s in samples]
    torch.testing.assert_close(fisher["head"], (one[0] + one[1]) / 2)


def test_penalty_zero_at_anchor_positive_away_and_pulls_back():
    m = TinyLM()
    fisher, _ = compute_fisher(m, [([0, 1], [2, 3]), ([4], [1])])
    st = EWCState(lam=10.0, normalize=True)
    st.consolidate(m, fisher)
    assert st.penalty_value(m) == pytest.approx(0.0, abs=1e-12)
    anchor = {n: p.detach().clone() for n, p in m.named_parameters()}
    with torch.no_grad():
        m.head.add_(0.1 * torch.randn_like(m.head))
    pen = st.penalty(m)
    assert pen.item() > 0
    expect = 0.5 * 10.0 * sum((st.fisher[n] * (p.detach() - anchor[n]) ** 2).sum() for n, p in m.named_parameters())
    assert pen.item() == pytest.approx(expect.item(), rel=1e-5)
    pen.backward()
    # the gradient is lambda * F * (theta - theta*): it points away from the anchor, so a step
    # against it moves back towards the anchor
    d = m.head.detach() - anchor["head"]
    torch.testing.assert_close(m.head.grad, 10.0 * st.fisher["head"].float() * d)
    before = (d.pow(2) * st.fisher["head"]).sum()
    with torch.no_grad():
        m.head.sub_(0.01 * m.head.grad)
    after = ((m.head.detach() - anchor["head"]).pow(2) * st.fisher["head"]).sum()
    assert after < before


def test_online_consolidation_and_persistence(tmp_path):
    m = TinyLM()
    f1, _ = compute_fisher(m, [([0], [1])])
    f2, _ = compute_fisher(m, [([3], [4])])
    st = EWCState(lam=2.0, gamma=0.5, normalize=False)
    st.consolidate(m, f1)
    st.consolidate(m, f2)
    assert st.fisher["head"].dtype == torch.bfloat16 and st.anchor["head"].dtype == torch.float32
    # stored in bfloat16: 8 significant bits
    torch.testing.assert_close(st.fisher["head"].float(), 0.5 * f1["head"] + f2["head"], rtol=4e-3, atol=0)
    assert len(st.stages) == 2
    st.save(tmp_path)
    back = EWCState.load(tmp_path)
    torch.testing.assert_close(back.fisher["emb"], st.fisher["emb"])
    torch.testing.assert_close(back.anchor["head"], st.anchor["head"])
    assert back.lam == 2.0 and back.gamma == 0.5


def test_normalized_fisher_has_mean_one():
    m = TinyLM()
    f, _ = compute_fisher(m, [([0, 1], [2])])
    st = EWCState(lam=1.0, normalize=True)
    st.consolidate(m, f)
    total = sum(t.sum() for t in st.fisher.values())
    count = sum(t.numel() for t in st.fisher.values())
    assert (total / count).item() == pytest.approx(1.0, rel=1e-5)


def test_fisher_on_a_real_transformer_only_covers_trainable_params(tiny_model):
    from grpo_app.core.models import freeze_embeddings

    freeze_embeddings(tiny_model)
    fisher, stats = compute_fisher(tiny_model, [([1, 2, 3], [4, 5]), ([6], [7, 8, 9])])
    assert "model.embed_tokens.weight" not in fisher
    assert all(f.shape == dict(tiny_model.named_parameters())[n].shape for n, f in fisher.items())
    assert stats.mean > 0


def test_offloaded_state_matches_in_memory_and_holds_no_tensors(tmp_path):
    """With offload the Fisher and anchor live only in the folder's file, read per tensor when used:
    penalty, its gradient, online consolidation and persistence equal the in-memory state's."""
    from grpo_app.training.ewc import TensorFile

    m = TinyLM()
    f1, _ = compute_fisher(m, [([0, 1], [2, 3])])
    mem = EWCState(lam=3.0, gamma=0.5, normalize=True)
    disk = EWCState(lam=3.0, gamma=0.5, normalize=True, offload=True)
    mem.consolidate(m, f1)
    disk.consolidate(m, f1, folder=tmp_path / "s0")
    assert isinstance(disk.fisher, TensorFile) and isinstance(disk.anchor, TensorFile)
    assert not any(isinstance(v, torch.Tensor) for v in vars(disk).values())
    with torch.no_grad():
        m.head.add_(0.1 * torch.randn_like(m.head))  # stage 2 moves the weights
    f2, _ = compute_fisher(m, [([4], [1, 2])])
    mem.consolidate(m, f2)
    disk.consolidate(m, f2, folder=tmp_path / "s1")  # reads stage 1's file while writing stage 2's
    assert disk.folder == tmp_path / "s1" and len(disk.stages) == 2
    for n in mem.fisher:
        assert torch.equal(disk.fisher[n], mem.fisher[n]) and disk.fisher[n].dtype == torch.bfloat16
        assert torch.equal(disk.anchor[n], mem.anchor[n])
    with torch.no_grad():
        m.emb.add_(0.05 * torch.randn_like(m.emb))
    for st in (mem, disk):
        m.zero_grad()
        st.penalty(m).backward()
        st.grads = {n: p.grad.clone() for n, p in m.named_parameters()}
        m.zero_grad()
        st.add_penalty_grad(m)
        st.added = {n: p.grad.clone() for n, p in m.named_parameters()}
    assert mem.penalty_value(m) > 0
    assert disk.penalty_value(m) == pytest.approx(mem.penalty_value(m), rel=1e-6)
    for n in mem.grads:
        torch.testing.assert_close(disk.grads[n], mem.grads[n])
        torch.testing.assert_close(disk.added[n], mem.added[n])
    # persistence: the state saved from memory and the offloaded one load to the same tensors
    mem.save(tmp_path / "copy")
    for folder in (tmp_path / "copy", tmp_path / "s1"):
        back = EWCState.load(folder, offload=True)
        assert back.gamma == 0.5 and len(back.stages) == 2
        for n in mem.fisher:
            assert torch.equal(back.fisher[n], mem.fisher[n]) and torch.equal(back.anchor[n], mem.anchor[n])
    disk.save(tmp_path / "copy2")  # an offloaded state saved elsewhere is copied tensor by tensor
    assert torch.equal(EWCState.load(tmp_path / "copy2").anchor["head"], mem.anchor["head"])


def test_truncated_offloaded_file_gives_a_clear_error(tmp_path):
    m = TinyLM()
    f, _ = compute_fisher(m, [([0], [1])])
    st = EWCState(lam=1.0, offload=True)
    st.consolidate(m, f, folder=tmp_path)
    path = tmp_path / "ewc.safetensors"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(ValueError, match="truncated"):
        st.penalty_value(m)


def test_fisher_of_a_real_decoder_with_tied_weights_equals_squared_autograd_gradients(tokenizer):
    """compute_fisher folds each gradient into the Fisher as backward produces it; the result must be the
    mean of the squared per-sample gradients autograd returns, the tied embedding/LM-head summed."""
    from grpo_app.training.ewc import sequence_logprob, trainable_parameters

    from .conftest import make_tiny

    model = make_tiny(tokenizer)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    samples = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])]
    params = trainable_parameters(model)
    expect = {n: torch.zeros_like(p) for n, p in params}
    for prompt, completion in samples:
        grads = torch.autograd.grad(sequence_logprob(model, prompt, completion), [p for _, p in params])
        for (n, _), g in zip(params, grads):
            expect[n] += g.pow(2) / len(samples)
    for p in model.parameters():
        p.grad = torch.ones_like(p)  # leftovers of a training step are dropped, not folded in
    fisher, stats = compute_fisher(model, samples)
    assert stats.samples == 2 and all(p.grad is None for p in model.parameters())
    for n, f in fisher.items():
        torch.testing.assert_close(f, expect[n], rtol=1e-5, atol=1e-12, msg=n)
    assert fisher["model.embed_tokens.weight"].abs().sum() > 0
    assert not any(p._backward_hooks for p in model.parameters())  # the folding hooks are removed
