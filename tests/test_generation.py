import torch

from grpo_app.generation import SamplingParams, _AnswerLineDetector, generate_completions, use_fast_attention


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
