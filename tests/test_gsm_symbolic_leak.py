"""gsm_symbolic (the offline stand-in for GSM8K) is made of GSM8K *test* stories: the bench that measures
it, and the Compare note that a run trained on it gets when it is scored on real GSM8K test."""

import json
import os
import random
from pathlib import Path

import pytest

from bench.symbolic_overlap import jaccard, measure, templates, words
from grpo_app.ui.compare_tab import result_note

GSM8K_DIR = Path(os.environ.get("GRPO_APP_GSM8K_DIR", "../shared/data/gsm8k"))


def test_jaccard_of_word_sets():
    assert jaccard(words("Emily peels 6 shrimp."), words("emily PEELS 90 shrimp!")) == 1.0  # numbers and case ignored
    assert jaccard(words("a b c d"), words("a b x y")) == pytest.approx(2 / 6)
    assert jaccard(words(""), words("")) == 0.0


def test_a_template_is_matched_to_the_question_it_retells():
    gen = dict(templates())[0]  # template 0: the peel-and-saute story
    q = gen(random.Random(5))["question"]
    test = ["Emily can peel 6 shrimp a minute and saute 30 shrimp in 10 minutes. How long will it take her to peel and cook 90 shrimp?", "Tom has 3 apples."]
    train = ["A bus carries 40 people.", "Tom has 3 apples."]
    res = measure(train, test)
    row = next(r for r in res["rows"] if r["template"] == 0)
    assert row["best_test"] >= 0.5 and row["best_test_question"].startswith("Emily can peel")
    assert row["best_train"] < 0.3
    assert res["templates"] == len(templates()) > 50 and "peel" in q


@pytest.mark.skipif(not (GSM8K_DIR / "test.jsonl").is_file(), reason="needs the GSM8K folder")
def test_the_templates_retell_gsm8k_test_questions_not_train_ones():
    def load(split):
        with open(GSM8K_DIR / f"{split}.jsonl", encoding="utf-8") as f:
            return [json.loads(line)["question"] for line in f]

    res = measure(load("train"), load("test"))
    n = res["templates"]
    assert res["test"]["shared_half_or_more"] >= 0.9 * n  # what data.GSM_SYMBOLIC_LEAK says (84 of 85 measured)
    assert res["train"]["shared_half_or_more"] <= 0.2 * n


def _run(tmp_path, overrides=()):
    from grpo_app.core.config import load_config
    from grpo_app.core.run_folder import RunDir

    return RunDir.create(tmp_path, load_config("classroom", list(overrides)))


def test_leak_from_the_config_before_any_stage_started(tmp_path):
    from grpo_app.evaluation.scoring import gsm8k_test_leak

    assert gsm8k_test_leak(_run(tmp_path / "a")) == ""  # stage 3 trains on GSM8K train when it is there
    leak = gsm8k_test_leak(_run(tmp_path / "b", ["data.gsm8k=offline"]))
    assert "stage 3 (gsm8k-easy)" in leak and "templates of GSM8K test questions" in leak
    assert "stage 1" not in leak and "stage 2" not in leak


def test_leak_from_the_stages_the_run_started(tmp_path):
    from grpo_app.evaluation.scoring import gsm8k_test_leak

    fell_back = _run(tmp_path / "a")  # asked for GSM8K, found none at run time: the events say so
    for k, source in enumerate(("arithmetic", "arithmetic", "gsm_symbolic")):
        fell_back.append_event("stage_start", stage=k, name=f"s{k}", source=source)
    assert "stage 3" in gsm8k_test_leak(fell_back)
    real = _run(tmp_path / "b", ["data.gsm8k=offline"])  # the events win over the config's guess
    for k, source in enumerate(("arithmetic", "arithmetic", "gsm8k")):
        real.append_event("stage_start", stage=k, name=f"s{k}", source=source)
    assert gsm8k_test_leak(real) == ""


@pytest.mark.parametrize("eval_set, origin, flagged", [
    ("gsm8k", "GSM8K test (local folder x), difficulty 0-99", True),
    ("gsm8k", "held-out reasoning-gym gsm_symbolic, difficulty 0-99", False),  # offline Compare: said otherwise
    ("stage:0", "held-out reasoning-gym basic_arithmetic", False),
])
def test_run_compare_marks_a_gsm8k_score_that_is_not_held_out(tmp_path, monkeypatch, eval_set, origin, flagged):
    from grpo_app.evaluation import scoring as evaluation

    run = _run(tmp_path, ["data.gsm8k=offline"])
    rec = {"id": "p0", "difficulty": 1, "question": "q", "gold": "3", "pred": "3", "output": "#### 3",
           "correct": 1, "strict_correct": 1, "has_format": 1}

    def fake_compare(base, trained, settings, data_cfg, *a, **kw):  # the scoring itself is tested elsewhere
        return {"origin": origin, "base": {"records": [rec]}, "trained": {"records": [rec]}}

    monkeypatch.setattr(evaluation, "compare_models", fake_compare)
    monkeypatch.setattr(evaluation, "training_questions", lambda cfg: {"other"})
    res = evaluation.run_compare(evaluation.CompareSpec.for_run(run, eval_set, n=1))
    assert ("not_held_out" in res) is flagged
    saved = json.loads(next(run.eval_dir.glob("*.json")).read_text())
    assert ("not_held_out" in saved) is flagged
    if flagged:
        assert "templates of GSM8K test questions" in result_note({**res, "what": "GSM8K test"})


def test_the_evaluation_after_training_marks_it_too(tmp_path, monkeypatch):
    from grpo_app.evaluation import scoring as evaluation

    run = _run(tmp_path, ["data.gsm8k=offline"])
    rec = {"id": "p0", "difficulty": 1, "question": "q", "gold": "3", "pred": "3", "output": "#### 3",
           "correct": 1, "strict_correct": 1, "has_format": 1}
    summary = {"n": 1, "accuracy": 1.0, "ci": [0.2, 1.0], "format_rate": 1.0}

    def fake_compare(*a, **kw):
        return {"origin": "GSM8K test (local folder x)", "paired": {"p_value": 1.0},
                "base": {"records": [rec], "summary": summary}, "trained": {"records": [rec], "summary": summary}}

    monkeypatch.setattr(evaluation, "compare_models", fake_compare)
    evaluation.evaluate_run_vs_base(run, n=1)
    saved = json.loads(next(run.eval_dir.glob("*.json")).read_text())
    assert "templates of GSM8K test questions" in saved["not_held_out"]
