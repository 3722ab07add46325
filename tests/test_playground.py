"""The Try tab's engine: input checks, scoring with the shared extractor, streaming two models at once."""

import pytest

from grpo_app.evaluation import ask as playground
from grpo_app.evaluation.ask import ModelCache, check_gold, check_question, finish, stream_answers


@pytest.mark.parametrize(
    "question,problem",
    [
        (None, "Type a question"),  # nothing typed
        ("   \n ", "Type a question"),  # only blanks
        ("x" * (playground.MAX_TRY_CHARS + 1), "keep it under"),  # a paste error
        ("What is 2 + 3?", None),
    ],
)
def test_check_question(question, problem):
    msg = check_question(question)
    assert (msg is None) if problem is None else (problem in msg)


@pytest.mark.parametrize(
    "gold,ok",
    [
        ("", True),  # empty: no expected answer
        (None, True),
        ("42", True),
        ("$1,200", True),  # dollars, thousands separator
        ("3/4", True),  # a fraction
        ("forty", False),  # words
        ("4 apples", False),
        ("1e999999999", False),  # a huge exponent (built a billion-digit integer before)
        ("inf", False),  # not finite
        ("Infinity", False),
        ("NaN", False),
        ("9" * 10_000, False),  # ten thousand digits
    ],
)
def test_check_gold(gold, ok):
    assert (check_gold(gold) is None) == ok


def test_finish_scores_like_training_and_evaluation():
    weights = {"correctness": 1.0, "strict_format": 0.2}
    f = finish("2 + 2 = 4\n#### 4", "4", weights)
    assert (f["pred"], f["how"], f["correct"], f["has_format"]) == ("4", "marker", True, True)
    assert f["rewards"] == {"correctness": 1.0, "strict_format": 1.0, "total": pytest.approx(1.2)}
    f = finish("I think the answer is 5", "4", weights)
    assert (f["pred"], f["how"], f["correct"]) == ("5", "last_number", False)
    assert f["rewards"]["correctness"] == 0.0 and not f["partial"]


def test_finish_without_gold_leaves_answer_rewards_out():
    f = finish("#### 4", "", {"correctness": 1.0, "strict_format": 0.2})
    assert f["correct"] is None and f["partial"]
    assert "correctness" not in f["rewards"] and f["rewards"]["strict_format"] == 1.0


def test_model_cache_keeps_the_most_recent(monkeypatch):
    loads = []

    def fake_load(name, int8=False, restrict_paths=False):
        loads.append(name)
        return (object(), object(), type("Spec", (), {"label": name})())

    monkeypatch.setattr(playground, "load_for_eval", fake_load)
    monkeypatch.setattr(playground, "model_bytes", lambda m: 10)
    cache = ModelCache(capacity=2)
    a = cache.get("a")
    assert cache.get("a") is a and loads == ["a"]
    cache.get("b")
    cache.get("a")  # a is now the most recent
    cache.get("c")  # evicts b
    assert [m["name"] for m in cache.loaded()] == ["a", "c"]
    cache.get("a", fingerprint="new-weights")  # a changed on disk: loaded again
    assert loads == ["a", "b", "c", "a"]


def test_stream_answers_two_models_at_once(tokenizer):
    from tests.conftest import make_tiny

    models = {
        "base": (make_tiny(tokenizer, seed=1), tokenizer, None),
        "trained": (make_tiny(tokenizer, seed=2), tokenizer, None),
    }
    snaps = list(stream_answers(models, "What is 2 + 3?", "Answer briefly.", max_new_tokens=12, interval=0.05))
    last = snaps[-1]
    assert set(last) == {"base", "trained"} and all(v["done"] for v in last.values())
    assert all(
        v["tokens"] <= 12 and v["error"] is None and v["stop"] in ("eos", "answer", "length") for v in last.values()
    )
    again = list(stream_answers(models, "What is 2 + 3?", "Answer briefly.", max_new_tokens=12))[-1]
    assert again["base"]["text"] == last["base"]["text"]  # greedy: the same question gives the same answer


def test_stream_answers_stops_when_asked(tokenizer):
    from tests.conftest import make_tiny

    models = {"base": (make_tiny(tokenizer), tokenizer, None)}
    last = list(stream_answers(models, "Count.", "", max_new_tokens=400, should_stop=lambda: True))[-1]
    assert last["base"]["done"] and last["base"]["tokens"] <= 2


def test_stream_answers_reports_a_failing_model():
    class Broken:
        def decode(self, *a, **k):
            return ""

        def apply_chat_template(self, *a, **k):
            raise RuntimeError("no chat template")

    last = list(stream_answers({"base": (None, Broken(), None)}, "q", "", max_new_tokens=4))[-1]
    assert last["base"]["done"] and "no chat template" in last["base"]["error"]


def test_a_hostile_expected_answer_returns_at_once():
    import time

    t = time.perf_counter()
    for gold in ("1e999999999", "-1E+999999999", "9" * 10_000 + "/7", "Infinity"):
        assert "not a number" in check_gold(gold)
        assert finish("#### 3", gold, {"correctness": 1.0})["gold"] is None
    assert time.perf_counter() - t < 0.5
