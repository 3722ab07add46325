import pytest

from grpo_app.core.rewards import (
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


def test_written_calculations_are_read_and_checked_exactly():
    from grpo_app.core.answers import question_numbers, written_calculations

    calcs = written_calculations("<<3*4=12>> so 12 + 5 - 2 = 15, 2x3=7, $1,200 / 4 = $300, 10 ÷ 4 = 2.5, 3/0=1, 0.1*3=0.3")
    assert [(c["operands"], c["result"], c["right"]) for c in calcs] == [
        (["3", "4"], "12", True),
        (["12", "5", "2"], "15", True),
        (["2", "3"], "7", False),
        (["1200", "4"], "300", True),
        (["10", "4"], "2.5", True),
        (["3", "0"], "1", False),  # a division by zero is never right
        (["0.1", "3"], "0.3", True),  # exact decimals: no float rounding
    ]
    assert written_calculations("2 + 3 * 4 = 14")[0]["right"]  # * before +
    assert not written_calculations("2 + 3 * 4 = 20")[0]["right"]
    assert written_calculations("x = 5, 12 = 12, (3 + 4) = 7") == []  # no operator, or parentheses: not read
    assert len(written_calculations("1+1=2 " * 100)) == 32  # bounded work on a long ramble
    assert question_numbers("Betty paid $1,200.50 for 3 kg") == {"1200.5", "3"}


Q = "They make 100 lasagnas with 2 pounds each and pies with 3 pounds each, 500 pounds in all. How many pies?"


@pytest.mark.parametrize(
    "text, difficulty, expected",
    [
        ("100 * 2 = 200 pounds, 500 - 200 = 300 pounds, 300 / 3 = 100 pies.\n#### 100", 3, 1.0),  # every step
        ("100 * 2 = 200 pies.\n#### 200", 3, 1 / 3),  # one step of three, right as arithmetic
        ("100 * 2 = 200 pies.\n#### 200", 0, 1.0),  # a problem that needs no calculation counts as one step
        ("1 + 1 = 2\n#### 2", 3, 0.0),  # right, but built on nothing in the question
        ("#### 100", 3, 0.0),  # no working shown
        ("100 * 2 = 200, 100 * 2 = 200, 100*2=200", 3, 1 / 3),  # a repeat counts once
        ("100 * 2 = 200, 200 + 7 = 207, 207 - 7 = 200", 2, 1.0),  # an earlier result is a number to build on
        ("100 * 2 = 200, 500 - 200 = 301", 2, 0.0),  # a wrong calculation takes one away
        ("100 * 2 = 300, 2 * 3 = 6, 6 * 2 = 12", 3, 1 / 3),  # 2 right and grounded, 1 wrong
    ],
)
def test_arithmetic_reward_credits_grounded_right_steps(text, difficulty, expected):
    from grpo_app.core.rewards import arithmetic

    assert arithmetic(None, [text, conv(text)], question=[Q, Q], difficulty=[difficulty] * 2) == [
        pytest.approx(expected)
    ] * 2


def test_arithmetic_reward_receives_the_dataset_columns_a_training_step_passes():
    from grpo_app.core.data import Problem, to_rows
    from grpo_app.core.rewards import arithmetic

    rows = to_rows([Problem(id="p", question=Q, answer="100", solution="", difficulty=3, source="gsm8k")], "Solve.")
    columns = {k: [rows[0][k]] for k in rows[0] if k != "prompt"}  # what TRL hands every reward function
    assert arithmetic(None, ["500 - 200 = 300. 300 / 3 = 100\n#### 100"], **columns) == [pytest.approx(2 / 3)]
    # the Try tab has no difficulty: one step; without a question nothing is checked against it
    assert score_text("1 + 1 = 2", "2", {"arithmetic": 1.0}) == {"arithmetic": 1.0, "total": 1.0}
    assert score_text("1 + 1 = 2", "2", {"arithmetic": 1.0}, question=Q)["arithmetic"] == 0.0
    assert "arithmetic" in REWARD_FUNCS
