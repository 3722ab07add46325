"""data.training_hint: the text after every question while training reaches every prompt the training
builds (its rows, the Fisher's reference samples, a resumed run's fresh samples), and nothing else: a run's
comparisons ask the plain question, as Try does. An empty hint changes nothing (the same prompt ids, the
same evaluation cache keys as before the option existed); a bench may still score with the hint."""

import hashlib
import json
from dataclasses import asdict

import pytest

from grpo_app.core.config import ConfigError, load_config
from grpo_app.core.data import Problem, to_rows
from grpo_app.core.prompts import build_messages, prompt_ids
from grpo_app.core.run_folder import RunDir
from grpo_app.evaluation import scoring as evaluation
from grpo_app.evaluation.scoring import CompareSpec, EvalSettings, evaluate, sample_pass_k

HINT = "\n\nEnd with the final answer on its own line as '#### <number>'."
SET = 'data.training_hint="\\n\\nEnd with the final answer on its own line as \'#### <number>\'."'


def _problems(n=4):
    return [Problem(str(i), f"What is {i} + 1?", str(i + 1), f"{i} + 1 = {i + 1}\n#### {i + 1}", 1, "arithmetic")
            for i in range(n)]


def test_the_yaml_override_reads_the_newlines():
    assert load_config("classroom", [SET]).data.training_hint == HINT
    assert load_config("classroom").data.training_hint == ""


def test_the_hint_ends_the_user_turn(tokenizer):
    msgs = build_messages("What is 2 + 3?", "Solve it.", HINT)
    assert msgs == [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 2 + 3?" + HINT}]
    plain = prompt_ids(tokenizer, "What is 2 + 3?", "Solve it.")
    assert prompt_ids(tokenizer, "What is 2 + 3?", "Solve it.", "") == plain  # empty: the prompt as before
    with_it = tokenizer.decode(prompt_ids(tokenizer, "What is 2 + 3?", "Solve it.", HINT))
    assert "What is 2 + 3?" + HINT in with_it and with_it.index(HINT) < with_it.rindex("assistant")
    rows = to_rows(_problems(1), "Solve it.", HINT)
    assert rows[0]["prompt"][-1]["content"] == "What is 0 + 1?" + HINT and rows[0]["question"] == "What is 0 + 1?"


def test_too_long_is_refused_with_the_field():
    with pytest.raises(ConfigError) as ei:
        load_config("quick", [f"data.training_hint={'x' * 1001}"])
    assert any(path == "data.training_hint" and "1000" in msg for path, msg in ei.value.errors)


def test_training_prompts_carry_it(tokenizer):
    from grpo_app.training.engine import _fresh_samples, _reference_samples

    from .conftest import make_tiny

    cfg = load_config("classroom", [SET, "grpo.max_completion_length=8"])
    for prompt, _completion in _reference_samples(tokenizer, _problems(), cfg.data, 2, seed=0):
        assert tokenizer.decode(prompt).count(HINT) == 1
    fresh = _fresh_samples(make_tiny(tokenizer), tokenizer, _problems(), cfg, 2, seed=0)
    assert len(fresh) == 2 and all(tokenizer.decode(s[0]).count(HINT) == 1 for s in fresh)


def test_a_runs_comparisons_ask_the_plain_question(tmp_path):
    run = RunDir.create(tmp_path, load_config("classroom", [SET]))
    for eval_set in ("stage:0", "stage:2", "gsm8k"):
        assert CompareSpec.for_run(run, eval_set, n=5).settings.after_question == ""


def test_cache_keys_without_it_are_unchanged_and_with_it_differ():
    s = EvalSettings(n=7)
    st = asdict(s)
    for key in ("pass_k", "pass_temperature", "after_question", "packed_weights"):
        st.pop(key)
    blob = json.dumps({"models": [evaluation._model_fingerprint("tiny-random")], "settings": st}, sort_keys=True)
    assert evaluation.cache_key(["tiny-random"], s) == hashlib.sha256(blob.encode()).hexdigest()[:16]
    assert evaluation.cache_key(["tiny-random"], EvalSettings(n=7, after_question=HINT)) != evaluation.cache_key(
        ["tiny-random"], s
    )
    # packed weights change how the products are computed, not the answers: cached answers stay valid
    assert evaluation.cache_key(["tiny-random"], EvalSettings(n=7, packed_weights=False)) == evaluation.cache_key(
        ["tiny-random"], s
    )


def test_scoring_and_pass_k_can_ask_with_it(tiny_model, tokenizer, monkeypatch):
    seen = []
    real = evaluation.prompt_ids

    def spy(tok, question, system_prompt, after_question=""):
        seen.append(after_question)
        return real(tok, question, system_prompt, after_question)

    monkeypatch.setattr(evaluation, "prompt_ids", spy)
    probs = _problems(3)
    evaluate(tiny_model, tokenizer, probs, EvalSettings(n=3, max_new_tokens=8, batch_size=4, after_question=HINT))
    sample_pass_k(tiny_model, tokenizer, probs, EvalSettings(n=3, max_new_tokens=8, batch_size=4, pass_k=2,
                                                            pass_temperature=1.0, after_question=HINT))
    assert len(seen) == 3 + 3 * 2 and set(seen) == {HINT}


def test_the_model_card_names_the_hint(tmp_path):
    from grpo_app.export.model_files import model_card

    card = model_card(RunDir.create(tmp_path, load_config("classroom", [SET])))
    assert "every question was followed by this hint" in card and HINT.strip() in card
    assert "this hint" not in model_card(RunDir.create(tmp_path / "plain", load_config("classroom")))


def test_a_training_run_samples_with_the_hint_and_records_the_plain_question(tmp_path, tokenizer, monkeypatch):
    """End to end: every prompt the training sampler gets carries the hint once; the step view keeps the question."""
    from grpo_app.training import engine, trainer

    seen = []
    real = trainer.generate_completions

    def spy(model, tok, prompt_ids, params, **kw):
        seen.extend(prompt_ids)
        return real(model, tok, prompt_ids, params, **kw)

    monkeypatch.setattr(trainer, "generate_completions", spy)
    cfg = load_config("tests/configs/tiny.yaml", [f"run.output_dir={tmp_path}", 'data.training_hint=" Reply with ####."',
                                                  "stages[0].steps=1", "stages[1].steps=1", "ewc.enabled=false"])
    steps = []

    class Steps(engine.Reporter):
        def step(self, snap):
            steps.append(snap)

    engine.train(cfg, RunDir.create(tmp_path, cfg), reporter=Steps())
    assert len(seen) == 2 * 8  # two steps of G = 4 x 2 prompts
    assert all(tokenizer.decode(ids).count(" Reply with ####.") == 1 for ids in seen)
    questions = [g["question"] for snap in steps for g in snap["groups"]]
    assert questions and all(q.startswith("Calculate") and "Reply with" not in q for q in questions)
