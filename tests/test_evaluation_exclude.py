"""compare_models can leave out given questions (a run's training questions, for held-out sets)."""

from grpo_app.evaluation import EvalSettings, compare_models, eval_problems


def test_compare_models_never_scores_excluded_questions(tmp_path, monkeypatch):
    from grpo_app.models import cache_root

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
