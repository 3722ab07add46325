import pytest

from grpo_app.rewards import (
    REWARD_FUNCS,
    build_rewards,
    correctness,
    is_correct,
    lenient_correctness,
    score_text,
    soft_format,
    strict_format,
)


def conv(text):
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize(
    "text, gold, correct, strict, soft, lenient",
    [
        ("5+3=8\n#### 8", "8", 1.0, 1.0, 1.0, 1.0),  # right, well formatted
        ("#### 8 apples", "8", 1.0, 0.0, 1.0, 1.0),  # right, but the last line is not only the number
        ("#### 1,200", "1200", 1.0, 1.0, 1.0, 1.0),  # separators
        ("#### 7", "8", 0.0, 1.0, 1.0, 0.0),  # formatted but wrong
        ("the answer is 8", "8", 0.0, 0.0, 0.0, 1.0),  # right number, no '####': only the lenient reward pays
        ("8 + 1 = 9, so 9", "8", 0.0, 0.0, 0.0, 0.0),  # lenient reads the last number, not any number
        ("#### 9\nor maybe 8", "8", 0.0, 0.0, 1.0, 0.0),  # a '####' answer wins over a later number
        ("#### \\frac{3}{4}", "0.75", 1.0, 0.0, 0.0, 1.0),  # math-verify reads LaTeX (no signals used)
        ("", "8", 0.0, 0.0, 0.0, 0.0),
    ],
)
def test_reward_table(text, gold, correct, strict, soft, lenient):
    for c in (text, conv(text)):  # plain and conversational completions
        assert lenient_correctness(None, [c], answer=[gold]) == [lenient]
        assert correctness(None, [c], answer=[gold]) == [correct]
        assert strict_format(None, [c]) == [strict]
        assert soft_format(None, [c]) == [soft]


def test_flexible_correctness_used_by_evaluation():
    assert is_correct("the answer is 8", "8", strict=False)
    assert not is_correct("the answer is 8", "8", strict=True)
    assert is_correct("so \\boxed{12}", "12", strict=False)


def test_rewards_run_off_the_main_thread():
    import threading

    out = {}
    t = threading.Thread(target=lambda: out.update(v=correctness(None, ["#### \\frac{1}{2}"], answer=["0.5"])))
    t.start()
    t.join()
    assert out["v"] == [1.0]


def test_build_and_score():
    funcs, weights = build_rewards({"correctness": 1.0, "strict_format": 0.2, "brevity": 0.0})
    assert [f.__name__ for f in funcs] == ["correctness", "strict_format"] and weights == [1.0, 0.2]
    s = score_text("2+3=5\n#### 5", "5", {"correctness": 1.0, "strict_format": 0.2})
    assert s == {"correctness": 1.0, "strict_format": 1.0, "total": pytest.approx(1.2)}
    assert set(REWARD_FUNCS) >= {"correctness", "strict_format", "soft_format", "has_number", "closeness"}
