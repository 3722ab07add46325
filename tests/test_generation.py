import torch

from grpo_app.training.sampler import SamplingParams, _AnswerLineDetector, generate_completions, use_fast_attention


def prompts(tok, questions):
    out = []
    for q in questions:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def test_greedy_matches_hf_generate_with_padding(tiny_model, tokenizer):
    use_fast_attention(tiny_model)
    ps = prompts(tokenizer, ["What is 2+3?", "A much longer question about apples and pears, please?"])
    out = generate_completions(tiny_model, tokenizer, ps, SamplingParams(max_new_tokens=12, temperature=0,
                                                                         stop_at_answer=False), eos_token_ids=[-1])
    for p, got in zip(ps, out.completion_ids):
        ref = tiny_model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, min_new_tokens=12)
        assert got == ref[0, len(p):].tolist()


def test_sampling_is_reproducible_and_groups_share_one_prefill(tiny_model, tokenizer):
    ps = prompts(tokenizer, ["q one", "q two"])
    batch = [ps[0]] * 4 + [ps[1]] * 4
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7, stop_at_answer=False)
    a = generate_completions(tiny_model, tokenizer, batch, params, eos_token_ids=[-1])
    b = generate_completions(tiny_model, tokenizer, batch, params, eos_token_ids=[-1])
    assert a.completion_ids == b.completion_ids
    assert a.prompt_tokens == len(ps[0]) + len(ps[1])  # each distinct prompt prefilled once
    assert len({tuple(c) for c in a.completion_ids[:4]}) > 1  # sampling, not copies
    assert a.generated_tokens == 80 and a.stop_reasons == ["length"] * 8


def test_eos_ends_a_row(tiny_model, tokenizer):
    p = prompts(tokenizer, ["hello"])
    first = generate_completions(tiny_model, tokenizer, p, SamplingParams(max_new_tokens=1, temperature=0),
                                 eos_token_ids=[-1]).completion_ids[0][0]
    out = generate_completions(tiny_model, tokenizer, p, SamplingParams(max_new_tokens=8, temperature=0),
                               eos_token_ids=[first])
    assert out.completion_ids == [[]] and out.stop_reasons == ["eos"]


def test_answer_line_detector(tokenizer):
    det = _AnswerLineDetector(tokenizer)
    done_ids = tokenizer("2+3=5\n#### 5\n", add_special_tokens=False)["input_ids"]
    assert det.done(done_ids)
    assert not det.done(tokenizer("2+3=5\n#### 5", add_special_tokens=False)["input_ids"])  # line not finished
    assert not det.done(tokenizer("2+3=5\n", add_special_tokens=False)["input_ids"])


def test_streaming_callback_and_stop(tiny_model, tokenizer):
    seen = []
    out = generate_completions(tiny_model, tokenizer, prompts(tokenizer, ["x"]),
                               SamplingParams(max_new_tokens=50, temperature=0, stop_at_answer=False),
                               eos_token_ids=[-1], on_tokens=lambda r: seen.append(len(r[0])),
                               should_stop=lambda: len(seen) >= 3)
    assert seen[:3] == [1, 2, 3] and len(out.completion_ids[0]) == 3


def test_cascade_attention_matches_plain_attention_over_copied_prompts():
    """Prompt KV shared by rows (any order, uneven groups, padded prompts) gives the same attention as
    copying each row's prompt KV next to its own completion KV."""
    from grpo_app.training.sampler import _cascade_attention, _SharedPrefix

    torch.manual_seed(0)
    n_kv, g, dim, tp, ts = 2, 3, 8, 6, 4
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]])
    pk, pv = torch.randn(3, n_kv, tp, dim), torch.randn(3, n_kv, tp, dim)
    for rows in ([0, 0, 1, 1, 2, 2], [2, 0, 0, 1, 2]):  # dense groups, then uneven and out of order
        rows = torch.tensor(rows)
        b = rows.numel()
        q, sk, sv = torch.randn(b, n_kv, g, dim), torch.randn(b, n_kv, ts, dim), torch.randn(b, n_kv, ts, dim)
        shared = _SharedPrefix(prompt_mask, rows)
        layer = type("L", (), {"prefix_k": pk, "prefix_v": pv, "shared": shared})()
        got = _cascade_attention(q, sk, sv, layer, dim**-0.5)
        k = torch.cat([pk[rows], sk], 2)
        v = torch.cat([pv[rows], sv], 2)
        mask = torch.cat([prompt_mask[rows], torch.ones(b, ts, dtype=torch.long)], 1).bool()[:, None, None, :]
        s = (q @ k.transpose(-1, -2)) * dim**-0.5
        ref = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        assert shared.dense == (b == 6)
        torch.testing.assert_close(got, ref.reshape(b, 1, n_kv * g, dim), atol=1e-5, rtol=1e-5)


def test_shared_prompt_decoding_matches_sdpa_when_rows_leave_the_batch(tiny_model, tokenizer):
    import copy

    ps = prompts(tokenizer, ["What is 2+3?", "A much longer question about apples and pears, please?", "hi"])
    batch = [ps[0], ps[0], ps[1], ps[1], ps[2]]
    sampled = SamplingParams(max_new_tokens=10, temperature=1.0, stop_at_answer=False, seed=3)
    plain = copy.deepcopy(tiny_model)  # stays on SDPA with copied prompt KV
    first = generate_completions(plain, tokenizer, batch, sampled, eos_token_ids=[-1]).completion_ids
    eos = [first[2][3], first[3][2]]  # prompt 1's rows end early; the others go on without them
    use_fast_attention(tiny_model)
    a = generate_completions(tiny_model, tokenizer, batch, sampled, eos_token_ids=eos)
    b = generate_completions(plain, tokenizer, batch, sampled, eos_token_ids=eos)
    assert a.completion_ids == b.completion_ids and a.stop_reasons == b.stop_reasons
    assert a.stop_reasons[2:4] == ["eos", "eos"] and a.stop_reasons.count("length") >= 2
    assert len({tuple(c) for c in a.completion_ids}) == 5  # sampled rows, not copies


def test_two_level_inverse_cdf_equals_a_full_cumulative_search():
    from grpo_app.training.sampler import _inverse_cdf

    gen = torch.Generator().manual_seed(0)
    for vocab in (49152, 1000, 300):  # a multiple of the block, and two that are not
        probs = torch.softmax(torch.randn(64, vocab, generator=gen) * 3, -1)
        probs[:, ::7] = 0  # tokens that must never be drawn (as after top-k)
        probs /= probs.sum(-1, keepdim=True)
        u = torch.rand(64, 1, generator=gen)
        ref = torch.searchsorted(probs.cumsum(-1), u * probs.sum(-1, keepdim=True)).squeeze(-1)
        got = _inverse_cdf(probs, u)
        assert (got != ref).float().mean() < 0.02  # same draws, up to float rounding at a boundary
        assert bool((probs.gather(1, got[:, None]) > 0).all())
    edge = torch.zeros(2, 600)
    edge[:, 590] = 1.0  # all mass on one token of the last, partial block; u at both ends
    assert _inverse_cdf(edge, torch.tensor([[0.0], [0.9999999]])).tolist() == [590, 590]


def test_bucketed_prefill_equals_one_padded_batch(tiny_model, tokenizer):
    from grpo_app.training.sampler import _bucketed_prefill, _length_buckets, _prefill

    lengths = [3, 20, 21, 5, 40, 19, 4]
    buckets = _length_buckets(lengths)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths))) and len(buckets) > 1
    for b in buckets:  # padding each bucket to its longest costs at most 10%
        assert max(lengths[i] for i in b) * len(b) <= 1.1 * sum(lengths[i] for i in b)
    use_fast_attention(tiny_model)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 400, (n,), generator=g).tolist() for n in lengths]
    plen = max(lengths)
    with torch.inference_mode():
        one, logits_one = _prefill(tiny_model, prompts, tokenizer.pad_token_id, plen)
        split, logits_split = _bucketed_prefill(tiny_model, prompts, tokenizer.pad_token_id, plen)
    torch.testing.assert_close(logits_split, logits_one, rtol=1e-4, atol=1e-5)
    for a, b in zip(one.layers, split.layers):
        assert torch.isfinite(b.keys).all() and torch.isfinite(b.values).all()  # padding: masked, never NaN
        for i, n in enumerate(lengths):  # real positions agree
            torch.testing.assert_close(b.keys[i, :, plen - n :], a.keys[i, :, plen - n :], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(b.values[i, :, plen - n :], a.values[i, :, plen - n :], rtol=1e-4, atol=1e-5)


def test_portable_attention_branch_runs_under_bf16_autocast(tiny_model, tokenizer, monkeypatch):
    """A GPU takes the portable (matmul) branch of the shared-prompt attention, and TRL generates under bf16
    autocast there. Both on the CPU here: in float32 the portable branch decodes exactly as the fused one, and
    under CPU autocast it runs. (CPU autocast keeps the log-sum-exp in bf16, CUDA's makes it float32: the
    dtype mix that broke the first GPU run is checked on a GPU, not here.)"""
    import grpo_app.training.sampler as generation

    use_fast_attention(tiny_model)
    ps = prompts(tokenizer, ["What is 2+3?", "A much longer question about apples and pears, please?"])
    batch = [ps[0]] * 3 + [ps[1]] * 2
    greedy = SamplingParams(max_new_tokens=10, temperature=0, stop_at_answer=False)
    fused = generate_completions(tiny_model, tokenizer, batch, greedy, eos_token_ids=[-1]).completion_ids
    monkeypatch.setattr(generation, "_CPU_FLASH", False)
    assert generate_completions(tiny_model, tokenizer, batch, greedy, eos_token_ids=[-1]).completion_ids == fused
    sampled = SamplingParams(max_new_tokens=10, temperature=1.0, seed=1, stop_at_answer=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = generate_completions(tiny_model, tokenizer, batch, sampled, eos_token_ids=[-1])
    assert [len(c) for c in out.completion_ids] == [10] * 5
    assert len({tuple(c) for c in out.completion_ids[:3]}) > 1


def test_forced_answer_line_replaces_the_end_and_the_model_writes_on(tiny_model, tokenizer):
    from grpo_app.training.sampler import answer_line_start

    p = prompts(tokenizer, ["hello"])
    first = generate_completions(tiny_model, tokenizer, p, SamplingParams(max_new_tokens=1, temperature=0),
                                 eos_token_ids=[-1]).completion_ids[0][0]
    start = answer_line_start(tokenizer)
    assert tokenizer.decode(start) == "\n####"
    # the greedy first token is the end token here: without forcing the row is empty
    plain = generate_completions(tiny_model, tokenizer, p * 3, SamplingParams(max_new_tokens=8, temperature=0),
                                 eos_token_ids=[first])
    assert plain.completion_ids == [[]] * 3 and plain.extra == {}
    assert plain.end_tokens == [first] * 3 and plain.trained_ids() == [[first]] * 3  # training keeps the end token
    # forcing every row: the end becomes "\n####", then the model samples on (greedy) until it ends again
    params = SamplingParams(max_new_tokens=8, temperature=0, stop_at_answer=False, force_answer_line=1.0, seed=3)
    out = generate_completions(tiny_model, tokenizer, p * 3, params, eos_token_ids=[first])
    free = generate_completions(tiny_model, tokenizer, [p[0] + start], SamplingParams(
        max_new_tokens=8 - len(start), temperature=0, stop_at_answer=False), eos_token_ids=[first])
    for ids, why in zip(out.completion_ids, out.stop_reasons):
        # after the line's start the row is the model's own greedy continuation, and an end then ends it
        assert ids[: len(start)] == start and ids[len(start):] == free.completion_ids[0]
        assert why == free.stop_reasons[0]
    assert out.extra["forced_rows"] == [0, 1, 2] and out.extra["forced_tokens"] == 3 * len(start)
    assert out.extra["forced_at"] == {r: list(range(len(start))) for r in range(3)}  # where the hint stands
    # once only: when the token the model writes after the line's start is an end token too, the row ends there
    again = [first, free.completion_ids[0][0]]
    once = generate_completions(tiny_model, tokenizer, p, params, eos_token_ids=again)
    assert once.completion_ids == [start] and once.stop_reasons == ["eos"]
    # a share: about half of 64 rows, the same rows for the same seed
    half = SamplingParams(max_new_tokens=4, temperature=0, stop_at_answer=False, force_answer_line=0.5, seed=3)
    a = generate_completions(tiny_model, tokenizer, p * 64, half, eos_token_ids=[first])
    b = generate_completions(tiny_model, tokenizer, p * 64, half, eos_token_ids=[first])
    assert a.extra["forced_rows"] == b.extra["forced_rows"] and 16 <= len(a.extra["forced_rows"]) <= 48
    assert all((ids[: len(start)] == start) == (r in a.extra["forced_rows"]) for r, ids in enumerate(a.completion_ids))
    assert sorted(a.extra["forced_at"]) == a.extra["forced_rows"]


def test_a_row_that_already_wrote_its_answer_line_is_not_forced(tiny_model, tokenizer, monkeypatch):
    import grpo_app.training.sampler as generation

    p = prompts(tokenizer, ["hello"])
    first = generate_completions(tiny_model, tokenizer, p, SamplingParams(max_new_tokens=1, temperature=0),
                                 eos_token_ids=[-1]).completion_ids[0][0]
    read = []
    monkeypatch.setattr(generation, "has_final_line", lambda text: read.append(text) or True)  # "it has one"
    params = SamplingParams(max_new_tokens=8, temperature=0, stop_at_answer=False, force_answer_line=1.0)
    out = generate_completions(tiny_model, tokenizer, p * 2, params, eos_token_ids=[first])
    assert out.completion_ids == [[], []] and out.stop_reasons == ["eos", "eos"] and out.extra["forced_rows"] == []
    assert read == ["", ""]  # the rule read each row's text at its end


def test_a_run_on_answer_is_forced_only_when_asked(tiny_model, tokenizer, monkeypatch):
    """force_answer_line_run_on False: an ending that holds a '####' answer run on at the end of a line ('134.#### 134') is
    left as sampled (so the format reward sees it); one with no '####' answer still gets the hint."""
    import grpo_app.training.sampler as generation
    from grpo_app.training.sampler import _force_wanted

    on, off = SamplingParams(force_answer_line=1.0), SamplingParams(force_answer_line=1.0, force_answer_line_run_on=False)
    for text, want_on, want_off in (("3 + 4 = 7.#### 7", True, False), ("so 134 ####134", True, False),
                                    ("3 + 4 = 7", True, True), ("", True, True),
                                    ("3 + 4 = 7\n#### 7", False, False), ("#### 7\n", False, False)):
        assert (_force_wanted(text, on), _force_wanted(text, off)) == (want_on, want_off), text
    # through the sampler: the tiny model's greedy first token is its end, and every row "has run on"
    p = prompts(tokenizer, ["hello"])
    first = generate_completions(tiny_model, tokenizer, p, SamplingParams(max_new_tokens=1, temperature=0),
                                 eos_token_ids=[-1]).completion_ids[0][0]
    monkeypatch.setattr(generation, "extract_final_answer", lambda text: "7")
    kept = SamplingParams(max_new_tokens=8, temperature=0, stop_at_answer=False, force_answer_line=1.0,
                          force_answer_line_run_on=False)
    out = generate_completions(tiny_model, tokenizer, p * 2, kept, eos_token_ids=[first])
    assert out.completion_ids == [[], []] and out.stop_reasons == ["eos", "eos"] and out.extra["forced_rows"] == []
    kept.force_answer_line_run_on = True
    out = generate_completions(tiny_model, tokenizer, p * 2, kept, eos_token_ids=[first])
    assert out.extra["forced_rows"] == [0, 1]


def test_packed_weights_sample_the_same_tokens_and_leave_the_model_as_it_was(tiny_model, tokenizer):
    """`packed_weights`: every Linear runs on a oneDNN-packed copy of its weight for the call; the same model up to
    float rounding, so greedy and seeded sampling give the same tokens, and afterwards the forwards are the plain
    ones again (a weight changed after the call is the one the next call uses)."""
    import pytest

    from grpo_app.training.sampler import _onednn_linear, packed_linears

    if not _onednn_linear():
        pytest.skip("oneDNN is not in this torch build")
    use_fast_attention(tiny_model)
    ps = prompts(tokenizer, ["What is 2+3?", "A much longer question about apples and pears, please?"])
    batch = [ps[0]] * 4 + [ps[1]] * 4
    greedy = None
    for t in (0.0, 1.0):
        plain = SamplingParams(max_new_tokens=12, temperature=t, seed=5, stop_at_answer=False)
        packed = SamplingParams(max_new_tokens=12, temperature=t, seed=5, stop_at_answer=False, packed_weights=True)
        a = generate_completions(tiny_model, tokenizer, batch, plain, eos_token_ids=[-1])
        b = generate_completions(tiny_model, tokenizer, batch, packed, eos_token_ids=[-1])
        assert a.completion_ids == b.completion_ids
        if t == 0:
            greedy = a.completion_ids
    linears = [m for m in tiny_model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and not any("forward" in m.__dict__ for m in linears)
    # inside, the packed product is what runs, and it matches the plain one to float rounding
    x = torch.randn(3, 5, linears[0].in_features)
    with torch.inference_mode(), packed_linears(tiny_model, rows=3) as n:
        assert n == len(linears) and all("forward" in m.__dict__ for m in linears)
        got = linears[0](x)
        with packed_linears(tiny_model, rows=3) as again:  # already packed: left as it is, and not undone
            assert again == 0
        assert all("forward" in m.__dict__ for m in linears)
    assert torch.allclose(got, torch.nn.functional.linear(x, linears[0].weight, linears[0].bias), atol=1e-5)
    down = tiny_model.model.layers[-1].mlp.down_proj.weight
    kept = down.detach().clone()
    with torch.no_grad():  # a weight that changes between calls (a training step) is packed afresh
        down.add_(torch.randn(down.shape, generator=torch.Generator().manual_seed(0)) * 5)
    c = generate_completions(tiny_model, tokenizer, batch, SamplingParams(max_new_tokens=12, temperature=0,
                             stop_at_answer=False, packed_weights=True), eos_token_ids=[-1])
    d = generate_completions(tiny_model, tokenizer, batch, SamplingParams(max_new_tokens=12, temperature=0,
                             stop_at_answer=False), eos_token_ids=[-1])
    assert c.completion_ids == d.completion_ids and c.completion_ids != greedy
    with torch.no_grad():
        down.copy_(kept)
    with packed_linears(tiny_model, rows=3, enabled=False) as n:
        assert n == 0
