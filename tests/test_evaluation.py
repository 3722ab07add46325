import pytest

from grpo_app.core.config import DataConfig
from grpo_app.core.data import Problem
from grpo_app.evaluation.scoring import EvalSettings, compare_csv, eval_problems, evaluate, score_output, summarize
from grpo_app.evaluation.stats import mcnemar_exact, modal_answer, paired, wilson_interval


def test_modal_answer_is_the_score_of_always_writing_the_commonest_answer():
    assert modal_answer(["1", "3", "1", "12", "1", "3"]) == ("1", 0.5)
    # a tie goes to the shorter answer, then the first in sort order, whatever the order of the problems
    assert modal_answer(["10", "9", "10", "9"]) == ("9", 0.5)
    assert modal_answer(["b", "a"]) == modal_answer(["a", "b"]) == ("a", 0.5)
    assert modal_answer([]) is None


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    lo, hi = wilson_interval(81, 263)  # textbook example
    assert lo == pytest.approx(0.2553, abs=1e-3) and hi == pytest.approx(0.3662, abs=1e-3)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    for n in (1, 6, 7, 12, 200):  # exact ends at 0 and n (the formula alone rounds to ~1e-17 for some n)
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0


def test_mcnemar_exact_known_values():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(0, 10) == pytest.approx(2 / 1024)
    assert mcnemar_exact(2, 12) == pytest.approx(0.01294, abs=1e-5)  # binom.test(2, 14) two-sided


def rec(i, correct, fmt=False, d=1):
    return {"id": str(i), "correct": correct, "strict_correct": correct and fmt, "has_format": fmt, "difficulty": d,
            "tokens": 10, "question": "q", "gold": "1", "pred": "1" if correct else "2", "output": "o"}


def test_paired_counts_discordant_pairs():
    base = [rec(0, True), rec(1, False), rec(2, False), rec(3, True)]
    trained = [rec(0, True), rec(1, True), rec(2, True), rec(3, False)]
    p = paired(base, trained)
    assert (p["only_base"], p["only_trained"], p["both"], p["neither"]) == (1, 2, 1, 0)
    assert p["difference"] == pytest.approx(0.25) and p["p_value"] == pytest.approx(1.0)


def test_summary_by_difficulty_and_format():
    s = summarize([rec(0, True, True, 1), rec(1, False, True, 2), rec(2, True, False, 2)])
    assert s["accuracy"] == pytest.approx(2 / 3) and s["format_rate"] == pytest.approx(2 / 3)
    assert s["strict_accuracy"] == pytest.approx(1 / 3)
    assert s["by_difficulty"]["2"]["n"] == 2 and s["by_difficulty"]["2"]["accuracy"] == 0.5


def test_score_output_uses_the_shared_extractor():
    assert score_output("2+2=4\n#### 4", "4") == {"pred": "4", "how": "marker", "correct": True,
                                                  "strict_correct": True, "has_format": True}
    s = score_output("I think it is 4", "4")
    assert s["correct"] and not s["strict_correct"] and s["how"] == "last_number"


def test_evaluate_tiny_model_end_to_end(tiny_model, tokenizer):
    probs = [Problem(str(i), f"What is {i}+1?", str(i + 1), f"#### {i + 1}", 1, "arithmetic") for i in range(5)]
    res = evaluate(tiny_model, tokenizer, probs, EvalSettings(n=5, max_new_tokens=8, batch_size=2))
    assert [r["id"] for r in res["records"]] == [p.id for p in probs]
    s = res["summary"]
    correct = sum(r["correct"] for r in res["records"])
    assert s["n"] == 5 and s["correct"] == correct and s["accuracy"] == correct / 5
    assert tuple(s["ci"]) == wilson_interval(correct, 5)  # the interval of these records, not any interval
    assert all(r["tokens"] <= 8 for r in res["records"])
    import csv
    import io

    rows = list(csv.reader(io.StringIO(compare_csv({"base": res, "trained": res}))))
    assert len(rows) == 6 and rows[1][0] == "0" and rows[1][10] == res["records"][0]["output"]


def test_eval_problems_gsm8k_and_heldout():
    probs, origin = eval_problems(EvalSettings(n=20, seed=3), DataConfig())
    assert len(probs) == 20 and "GSM8K test" in origin
    again, _ = eval_problems(EvalSettings(n=20, seed=3), DataConfig())
    assert [p.id for p in again] == [p.id for p in probs]  # fixed seed, same problems
    ar, origin = eval_problems(EvalSettings(n=30, source="arithmetic", min_difficulty=1, max_difficulty=1), DataConfig())
    assert len(ar) == 30 and "held-out" in origin


def test_settings_bounds():
    with pytest.raises(ValueError, match="N must be"):
        EvalSettings(n=0).validate()
    with pytest.raises(ValueError, match="difficulty"):
        EvalSettings(min_difficulty=3, max_difficulty=1).validate()


def test_stage_heldout_sets_follow_a_stages_even_differences(tmp_path):
    """A take-away stage drawn with even differences is scored on problems drawn the same way (the matrix's
    column for it has a floor of ~1 in 8, not the ~30% of the default draw)."""
    from collections import Counter

    from grpo_app.core.config import load_config
    from grpo_app.core.run_folder import RunDir
    from grpo_app.evaluation.scoring import CompareSpec

    floors = {}
    for even in (False, True):
        cfg = load_config("progressive", [f"stages[2].even_differences={str(even).lower()}"])
        spec = CompareSpec.for_run(RunDir.create(tmp_path / str(even), cfg), "stage:2", n=100, seed=1000)
        assert spec.settings.extra["even_differences"] is even
        probs, _ = spec.problems()
        floors[even] = Counter(p.answer for p in probs).most_common(1)[0][1]
    assert floors[False] >= 25 and floors[True] <= 20, floors


def test_stage_heldout_sets_never_contain_training_questions(tmp_path):
    from grpo_app.core.config import load_config
    from grpo_app.core.run_folder import RunDir
    from grpo_app.evaluation.scoring import CompareSpec, training_questions

    cfg = load_config("classroom", ["stages[0].num_problems=300", "stages[1].num_problems=300"])
    run = RunDir.create(tmp_path, cfg)
    seen = training_questions(cfg)
    assert len(seen) > 500  # the three stages' pools, drawn as the engine draws them
    for k in (0, 1):
        spec = CompareSpec.for_run(run, f"stage:{k}", n=150, seed=0)
        s = spec.settings
        assert (s.source, s.extra["operators"], s.system_prompt) == ("arithmetic", cfg.stages[k].operators, cfg.data.system_prompt)
        assert spec.excluded_questions() == seen and spec.trained == str(run.final_dir)
        probs, origin = spec.problems()
        assert len(probs) == 150 and "held-out" in origin
        assert not {p.question for p in probs} & seen
        ops = [f" {o} " for o in cfg.stages[k].operators]
        assert all(any(o in p.question for o in ops) for p in probs)  # problems of the stage's own kind
        assert all(any(o in p.question for p in probs) for o in ops)  # every operator of a mixed stage appears
    g, origin = CompareSpec.for_run(run, "stage:2", n=40).problems(seen)
    assert "GSM8K test" in origin and all(1 <= p.difficulty <= 2 for p in g)
    gsm = CompareSpec.for_run(run, "gsm8k", n=10)
    assert gsm.stage is None and gsm.excluded_questions() is None and gsm.name.startswith("gsm8k-n10")


@pytest.mark.parametrize(
    "eval_set, message",
    [
        ("stage:3", "stages 0..2"),  # the classroom preset has three stages
        ("stage:-1", "stages 0..2"),
        ("stage:x", "stages 0..2"),
        ("gsm9k", "unknown problem set"),
        ("", "unknown problem set"),
    ],
)
def test_compare_spec_refuses_unknown_problem_sets(tmp_path, eval_set, message):
    from grpo_app.core.config import load_config
    from grpo_app.core.run_folder import RunDir
    from grpo_app.evaluation.scoring import CompareSpec

    run = RunDir.create(tmp_path, load_config("classroom"))
    with pytest.raises(ValueError, match=message):
        CompareSpec.for_run(run, eval_set)


@pytest.mark.parametrize("packed", [True, False])
def test_evaluation_packs_the_weights_once_per_call_when_asked(tiny_model, tokenizer, monkeypatch, packed):
    """EvalSettings.packed_weights: every batch of an evaluate call samples on the packed weights (the LM head's
    forward replaced while it runs), packed once for the call, and the plain forwards are back afterwards."""
    from grpo_app.evaluation import scoring
    from grpo_app.training.sampler import _onednn_linear

    if packed and not _onednn_linear():
        pytest.skip("oneDNN is not in this torch build")
    entered, during = [], []
    real_pack, real_gen = scoring.packed_linears, scoring.generate_completions

    def pack(model, rows, enabled=True):
        entered.append(enabled)
        return real_pack(model, rows, enabled)

    def gen(model, *args, **kwargs):
        during.append("forward" in model.lm_head.__dict__)
        return real_gen(model, *args, **kwargs)

    monkeypatch.setattr(scoring, "packed_linears", pack)
    monkeypatch.setattr(scoring, "generate_completions", gen)
    probs = [Problem(str(i), f"What is {i}+1?", str(i + 1), f"#### {i + 1}", 1, "arithmetic") for i in range(5)]
    res = evaluate(tiny_model, tokenizer, probs, EvalSettings(n=5, max_new_tokens=8, batch_size=2, packed_weights=packed))
    assert len(res["records"]) == 5
    assert entered == [packed] and during == [packed] * 3  # one packing for the call's three batches
    assert "forward" not in tiny_model.lm_head.__dict__
