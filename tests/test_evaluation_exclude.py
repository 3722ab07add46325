"""compare_models can leave out given questions (a run's training questions, for held-out sets)."""

from grpo_app.evaluation.scoring import EvalSettings, compare_models, eval_problems


def test_compare_models_never_scores_excluded_questions(tmp_path, monkeypatch):
    from grpo_app.core.models import cache_root

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))  # the tiny model borrows the embedded tokenizer
    monkeypatch.setenv("GRPO_APP_MODELS_DIR", str(tmp_path))  # a fresh evaluation cache

    settings = EvalSettings(
        n=6,
        seed=3,
        max_new_tokens=8,
        source="arithmetic",
        min_difficulty=1,
        max_difficulty=1,
        extra={"max_digits": 1, "operators": "+"},
    )
    everything, _ = eval_problems(settings)
    exclude = {p.question for p in everything[:3]}
    plain = compare_models("tiny-random", "tiny-random", settings)
    held = compare_models("tiny-random", "tiny-random", settings, exclude_questions=exclude)
    assert plain["key"] != held["key"]  # cached separately
    assert not {r["question"] for r in held["base"]["records"]} & exclude
    assert {r["question"] for r in plain["base"]["records"]} & exclude
    again = compare_models("tiny-random", "tiny-random", settings, exclude_questions=exclude)
    assert again["cached"] and again["key"] == held["key"]


def test_a_model_that_already_answered_these_problems_is_not_scored_again(tmp_path, monkeypatch):
    """Each model's answers are cached per (model, settings, problems): comparing a second model with the same
    base scores only the new one, and gives the base answers a fresh scoring gives."""
    from grpo_app.core.models import cache_root
    from grpo_app.evaluation import scoring as evaluation

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))
    monkeypatch.setenv("GRPO_APP_MODELS_DIR", str(tmp_path))
    settings = EvalSettings(n=5, seed=1, max_new_tokens=8, source="arithmetic", min_difficulty=1, max_difficulty=1,
                            extra={"max_digits": 1, "operators": "+"})
    calls = []
    real = evaluation.evaluate
    monkeypatch.setattr(evaluation, "evaluate", lambda model, *a, **kw: calls.append(model) or real(model, *a, **kw))
    first = compare_models("tiny-random", "tiny-random", settings)
    assert len(calls) == 1 and first["reused"] == ["trained"]  # the same model: answered once
    fresh = compare_models("tiny-random", "tiny-random", settings, use_cache=False)  # scored anew, both roles
    assert len(calls) == 3 and fresh["reused"] == []
    assert [r["output"] for r in fresh["base"]["records"]] == [r["output"] for r in first["base"]["records"]]
    # Other problems (one left out): a new set, so both models are scored again, once.
    other = compare_models("tiny-random", "tiny-random", settings, exclude_questions={first["base"]["records"][0]["question"]})
    assert len(calls) == 4 and other["key"] != first["key"]
    # A damaged cache file is not trusted: the model is scored again.
    for f in tmp_path.glob("eval_cache/model-*.json"):
        f.write_text('{"records": []}')
    again = compare_models("tiny-random", "tiny-random", settings, use_cache=True)
    assert again["cached"]  # (the pair's own result is whole)
    for f in tmp_path.glob("eval_cache/compare-*.json"):
        f.unlink()
    rescored = compare_models("tiny-random", "tiny-random", settings)
    assert len(calls) == 5 and rescored["reused"] == ["trained"]  # the base scored again, once


def test_the_same_settings_on_other_problems_are_other_results(tmp_path, monkeypatch):
    """The cache key holds the problems themselves: settings that draw other problems (GSM8K once missing, then
    present) never return the earlier set's result."""
    from grpo_app.core.models import cache_root
    from grpo_app.evaluation import scoring as evaluation

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))
    monkeypatch.setenv("GRPO_APP_MODELS_DIR", str(tmp_path))
    settings = EvalSettings(n=3, seed=0, max_new_tokens=8, source="arithmetic", min_difficulty=1, max_difficulty=1,
                            extra={"max_digits": 1, "operators": "+"})
    one = compare_models("tiny-random", "tiny-random", settings)
    probs, origin = eval_problems(settings)
    swapped = [type(p)(**{**p.__dict__, "question": p.question + " "}) for p in probs]
    monkeypatch.setattr(evaluation, "eval_problems", lambda *a, **kw: (swapped, origin))
    two = compare_models("tiny-random", "tiny-random", settings)
    assert not two["cached"] and two["key"] != one["key"]
    assert [r["question"] for r in two["base"]["records"]] == [p.question for p in swapped]


def _commuted(question: str) -> str:
    """'Calculate 4 - 1.' -> 'Calculate -1 + 4.'; 'Calculate 2 + 7.' -> 'Calculate 7 + 2.'"""
    a, op, b = question.removeprefix("Calculate ").removesuffix(".").split()
    return f"Calculate {'-' + b if op == '-' else b} + {a}."


def test_a_problem_planted_in_the_training_record_is_reported_in_the_held_out_set(tmp_path, monkeypatch, tokenizer):
    """Issue 46, 4: the overlap check reads what the run's steps trained on (trained_problems.jsonl), not only the
    pools the held-out set was filtered with (against which it is 0 by construction), and a commuted duplicate
    ('b + a' for 'a + b') counts too."""
    from grpo_app.core.config import load_config
    from grpo_app.core.models import cache_root
    from grpo_app.core.run_folder import RunDir
    from grpo_app.evaluation.scoring import CompareSpec, run_compare

    from .conftest import make_tiny

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))
    monkeypatch.setenv("GRPO_APP_MODELS_DIR", str(tmp_path / "models"))
    run = RunDir.create(tmp_path / "runs", load_config("tests/configs/tiny.yaml"))
    model = make_tiny(tokenizer)
    model.save_pretrained(run.final_dir)
    tokenizer.save_pretrained(run.final_dir)

    def compare():
        spec = CompareSpec.for_run(run, "stage:0", n=6, seed=0)
        spec.settings.max_new_tokens = 8
        return spec, run_compare(spec)

    spec, clean = compare()
    held = [r["question"] for r in clean["base"]["records"]]
    assert clean["overlap_with_training"]["in_training"] == 0 and len(held) == 6
    assert "no record" in clean["overlap_with_training"]["checked_against"]  # this run never trained a step

    run.append_trained(1, 0, [("planted-1", held[0]), ("planted-2", _commuted(held[1]))])
    assert _commuted(held[1]) != held[1]
    spec, checked = compare()
    ov = checked["overlap_with_training"]
    assert [r["question"] for r in checked["base"]["records"]] == held  # the same problems, now seen as trained on
    assert (ov["in_training"], ov["exact"], ov["commuted"]) == (2, 1, 1), ov
    assert ov["examples"] == [held[0], held[1]] and ov["checked_against"].startswith("the problems its steps")


def test_held_out_sets_leave_out_commuted_training_problems_too():
    from grpo_app.core.data import question_key

    settings = EvalSettings(n=6, seed=3, max_new_tokens=8, source="arithmetic", min_difficulty=1, max_difficulty=1,
                            extra={"max_digits": 1, "operators": "+-"})
    everything, _ = eval_problems(settings)
    trained = {_commuted(p.question) for p in everything[:3]}  # the first three, with their terms swapped
    held, _ = eval_problems(settings, exclude_questions=trained)
    assert not {question_key(p.question) for p in held} & {question_key(q) for q in trained}
    assert {p.question for p in everything[:3]}.isdisjoint({p.question for p in held})
