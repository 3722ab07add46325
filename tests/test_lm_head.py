"""The training pass's LM head keeps its logits for backward (trainer departure 3, `training/lm_head.py`):
it must give TRL's fused LM head's numbers bit for bit, and only where it is asked to, within its budget."""

import pytest
import torch
import trl.trainer.utils as trl_utils
from trl.kernels import chunked_logprob
from trl.kernels.chunked_logprob import ChunkedLogProbFunction

from grpo_app.core.models import freeze_embeddings
from grpo_app.training import lm_head
from grpo_app.training.lm_head import KeptTilesLogProb

from .conftest import make_tiny
from .test_trainer import batch, make_trainer


def _run(fn, n, vocab, hidden, bias, weight_grad, entropy_grad, chunk):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(n, hidden, generator=g).requires_grad_(True)
    w = (torch.randn(vocab, hidden, generator=g) * 0.05).requires_grad_(weight_grad)
    b = (torch.randn(vocab, generator=g) * 0.1).requires_grad_(weight_grad) if bias else None
    t = torch.randint(0, vocab, (n,), generator=g)
    lp, ent, *_ = fn.apply(h, w, b, t, 0.8, chunk, None, 1.0, ("entropy",))
    loss = (lp * torch.randn(n, generator=g)).sum() + (0.3 * ent.sum() if entropy_grad else 0.0)
    loss.backward()
    return [lp.detach(), ent.detach(), h.grad, w.grad, b.grad if b is not None else None]


@pytest.mark.parametrize("case", [
    (37, 1000, 24, False, False, False, 128),  # the trainer's case: frozen head, log-prob gradient only
    (37, 1000, 24, True, True, True, 128),  # bias, weight gradient, entropy gradient
    (50, 777, 16, False, True, False, 100),  # a last tile narrower than the rest
])
def test_kept_tiles_give_trl_numbers_bit_for_bit(case):
    ours, trl = _run(KeptTilesLogProb, *case), _run(ChunkedLogProbFunction, *case)
    for a, b in zip(ours, trl):
        assert (a is None and b is None) or torch.equal(a, b)


def test_kept_tiles_give_trl_numbers_over_several_position_tiles(monkeypatch):
    monkeypatch.setattr(lm_head, "TOKEN_CHUNK_SIZE", 16)  # 50 positions: four tiles of positions, both sides
    monkeypatch.setattr(chunked_logprob, "TOKEN_CHUNK_SIZE", 16)
    case = (50, 300, 16, True, True, True, 64)
    for a, b in zip(_run(KeptTilesLogProb, *case), _run(ChunkedLogProbFunction, *case)):
        assert torch.equal(a, b)


def _kept_by(budget, n=20, vocab=100, grad=True):
    h = torch.randn(n, 8, requires_grad=grad)
    w, t = torch.randn(vocab, 8), torch.randint(0, vocab, (n,))
    lm_head.install()
    with lm_head.keep_logits(budget):
        lp, *_ = trl_utils._ChunkedLogProbFunction.apply(h, w, None, t, 1.0, 32, None, 1.0, ())
        kept = lm_head.kept_bytes()
    return kept, lp


def test_logits_are_kept_only_inside_keep_logits_within_its_budget_and_for_a_backward():
    assert _kept_by(8000)[0] == 8000  # exactly the budget: kept
    assert _kept_by(7999)[0] == 0  # one byte short: TRL's function
    assert _kept_by(0)[0] == 0
    with torch.no_grad():
        assert _kept_by(10**9)[0] == 0  # nothing will be differentiated: nothing kept
    assert lm_head.kept_bytes() == 0  # outside: off
    kept, lp = _kept_by(10**9)
    assert kept == 8000 and type(lp.grad_fn).__name__.startswith("KeptTilesLogProb")
    assert type(_kept_by(0)[1].grad_fn).__name__.startswith("ChunkedLogProbFunction")


def test_the_trainer_pass_with_kept_logits_gives_the_same_loss_and_gradients_bit_for_bit(tmp_path, tokenizer):
    pi, pm, ci, cm = batch(tokenizer)
    inputs = {"prompt_ids": pi, "prompt_mask": pm, "completion_ids": ci, "completion_mask": cm,
              "advantages": torch.tensor([0.5, 1.2, -1.2, 0.3, -0.4, -0.4]), "num_items_in_batch": cm.sum()}
    out, kinds = [], []
    for budget in (10**9, 0):
        model = make_tiny(tokenizer)
        freeze_embeddings(model)
        tr = make_trainer(tmp_path / str(budget), model, tokenizer)
        with lm_head.keep_logits(budget):
            loss = tr._compute_loss(model, dict(inputs))
            kinds.append(lm_head.kept_bytes())
        loss.backward()
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    assert kinds[0] > 0 and kinds[1] == 0  # the first pass kept logits, the second ran TRL's function
    assert torch.equal(out[0][0], out[1][0])
    assert out[0][1].keys() == out[1][1].keys() and out[0][1]
    for n in out[0][1]:
        assert torch.equal(out[0][1][n], out[1][1][n]), n

