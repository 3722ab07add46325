import re

import pytest

from grpo_app.core.answers import answers_match, extract_answer, extract_final_answer, has_final_line, normalize_number
from grpo_app.core.config import DataConfig, StageConfig, load_config
from grpo_app.core.data import (
    DataError,
    gsm8k_difficulty,
    heldout_pool,
    load_gsm8k,
    make_arithmetic,
    parse_custom_dataset,
    stage_pool,
)


@pytest.mark.parametrize(
    "text, answer, how",
    [
        ("#### 72", "72", "marker"),  # GSM8K convention
        ("48/2 = 24\n#### $1,200.50", "1200.5", "marker"),  # dollars and thousands separators
        ("#### -3.", "-3", "marker"),  # trailing period
        ("#### 3/4", "0.75", "marker"),  # a fraction
        ("#### 5\nthen #### 6", "6", "marker"),  # the last marker wins
        ("the answer is 42.", "42", "last_number"),  # flexible fallback
        ("7 apples and 1,000 pears", "1000", "last_number"),
        ("no digits here", None, "none"),
        ("", None, "none"),
    ],
)
def test_extract_answer(text, answer, how):
    assert extract_answer(text) == (answer, how)


def test_strict_extraction_has_no_fallback():
    assert extract_final_answer("the answer is 42") is None
    assert extract_answer("the answer is 42", fallback=False) == (None, "none")


@pytest.mark.parametrize(
    "text, ok",
    [
        ("2+3=5\n#### 5", True),
        ("#### 5\n", True),
        ("#### 5 apples", False),  # the final line must be only the number
        ("#### 5\nI hope this helps", False),  # something after the answer line
        ("5", False),
        ("####", False),
    ],
)
def test_has_final_line(text, ok):
    assert has_final_line(text) is ok


def test_normalize_and_match():
    assert normalize_number("$1,234") == "1234"
    assert normalize_number("0.50") == "0.5"
    assert normalize_number("abc") is None
    assert answers_match("1200.50", "1200.5") and answers_match("3", "3.0000001")
    assert not answers_match("3", "4") and not answers_match(None, "4")


def test_gsm8k_difficulty_counts_calculator_steps():
    assert gsm8k_difficulty("a <<2*3=6>> b <<6+1=7>>\n#### 7") == 2
    assert gsm8k_difficulty("#### 7") == 0


def test_gsm8k_local_folder_is_used():
    probs, origin = load_gsm8k("test", DataConfig())
    assert len(probs) == 1319 and origin == "local GSM8K folder (GRPO_APP_GSM8K_DIR)"
    assert all(p.answer is not None for p in probs)
    assert probs[0].difficulty == gsm8k_difficulty(probs[0].solution)


def test_offline_mode_falls_back_to_generated_tasks():
    stage = StageConfig(name="g", source="gsm8k", min_difficulty=2, max_difficulty=4, num_problems=20)
    pool = stage_pool(stage, DataConfig(gsm8k="offline"), seed=1)
    assert pool.source == "gsm_symbolic" and "GSM8K unavailable" in pool.origin
    assert len(pool.problems) == 20 and all(2 <= p.difficulty <= 4 for p in pool.problems)


def test_stage_selects_by_difficulty():
    stage = StageConfig(name="e", source="gsm8k", min_difficulty=1, max_difficulty=2, num_problems=50)
    pool = stage_pool(stage, DataConfig(), seed=0)
    assert pool.source == "gsm8k" and len(pool.problems) == 50
    assert all(1 <= p.difficulty <= 2 for p in pool.problems)
    arith = stage_pool(StageConfig(name="a", source="arithmetic", min_difficulty=2, max_difficulty=2,
                                   operators="+-", num_problems=30), DataConfig(), seed=0)
    assert all(p.difficulty == 2 and p.source == "arithmetic" for p in arith.problems)
    assert all("*" not in p.question and "/" not in p.question for p in arith.problems)


def test_impossible_difficulty_range_is_a_clear_error():
    stage = StageConfig(name="x", source="gsm8k", min_difficulty=40, max_difficulty=50, num_problems=10)
    with pytest.raises(DataError, match="widen the range"):
        stage_pool(stage, DataConfig(), seed=0)


def test_heldout_is_disjoint_from_training_pool():
    stage = StageConfig(name="a", source="arithmetic", min_difficulty=1, max_difficulty=1, num_problems=300)
    train = stage_pool(stage, DataConfig(), seed=5)
    train_q = {p.question for p in train.problems}
    held = heldout_pool(stage, DataConfig(), n=200, seed=5, exclude_questions=train_q)
    assert len(held.problems) == 200
    assert not train_q & {p.question for p in held.problems}
    assert len({p.question for p in held.problems}) == 200  # no duplicates either


def test_custom_dataset_good_and_bad_rows():
    good = b'{"question": "What is 2+2?", "answer": "4"}\n{"question": "Q2", "answer": "x <<1+1=2>>\\n#### 2"}\n'
    probs = parse_custom_dataset(good, "d.jsonl")
    assert [p.answer for p in probs] == ["4", "2"] and probs[1].difficulty == 1
    bad = b'{"question": "ok", "answer": "4"}\nnot json\n{"question": "", "answer": "1"}\n{"question": "q", "answer": "many"}\n'
    with pytest.raises(DataError) as ei:
        parse_custom_dataset(bad, "d.jsonl")
    msg = str(ei.value)
    assert "3 bad rows" in msg and "line 2" in msg and "line 3" in msg and "line 4" in msg
    csv_ok = parse_custom_dataset(b"question,answer\nHow many?,12\n", "d.csv")
    assert csv_ok[0].answer == "12"
    with pytest.raises(DataError, match="header"):
        parse_custom_dataset(b"q,a\n1,2\n", "d.csv")
    with pytest.raises(DataError, match="UTF-8"):
        parse_custom_dataset(b"\xff\xfe\x00bad", "d.jsonl")
    with pytest.raises(DataError, match=".jsonl or .csv"):
        parse_custom_dataset(b"x", "d.txt")


def test_arithmetic_negation_is_off_by_default_and_can_be_asked_for():
    import re

    def operands(q):  # "Calculate -17 + (3 - -5)." -> do any operands carry their own minus sign?
        return re.findall(r"(?:^|[(\s])-\d", q.removeprefix("Calculate "))

    plain = make_arithmetic(200, seed=1, min_ops=1, max_ops=2, max_digits=2, operators="+-")
    assert not any(operands(p.question) or "(" in p.question for p in plain)
    negated = make_arithmetic(200, seed=1, min_ops=1, max_ops=2, max_digits=2, operators="+-", negation=True)
    assert any(operands(p.question) for p in negated)
    assert all(p.answer == p.solution.split("#### ")[-1] for p in plain + negated)


# ---- Untrusted numbers (Try's expected answer, uploaded answers): bounded, refused with the row -------------------
HOSTILE_NUMBERS = [
    "1e999999999",  # a huge exponent: Decimal -> Fraction would build a billion-digit integer
    "1e5",  # any exponent (people do not write answers that way)
    "-2E-3",
    "inf",  # not finite
    "-Infinity",
    "NaN",
    "9" * 10_000,  # ten thousand digits
    "1" + "0" * 40,  # one digit over MAX_NUMBER_DIGITS
    "0x1F",  # hexadecimal
    "1_000",  # Python's digit separator
    "٣",  # a digit of another script (Decimal would read it)
    "1/" + "9" * 5000,  # a fraction with a huge denominator
    "",  # nothing
]


@pytest.mark.parametrize("text", HOSTILE_NUMBERS)
def test_hostile_numbers_are_refused_at_once(text):
    import time

    t = time.perf_counter()
    assert normalize_number(text) is None
    assert time.perf_counter() - t < 0.2  # (the huge-exponent case took over a minute before the bound)


@pytest.mark.parametrize(
    "answer, gold",
    [
        ('"42"', "42"),  # text
        ("42", "42"),  # a JSON number
        ("2.5", "2.5"),
        ("1e20", "100000000000000000000"),  # a JSON number written with an exponent keeps its value
        ('"#### 1,200"', "1200"),  # a solution's final line
        ('"3 + 4 = 7\\n#### 7"', "7"),
    ],
)
def test_uploaded_answers_that_are_numbers(answer, gold):
    raw = f'{{"question": "q?", "answer": {answer}}}\n'.encode()
    assert parse_custom_dataset(raw, "d.jsonl")[0].answer == gold


@pytest.mark.parametrize(
    "answer",
    [
        '"1e999999999"',  # a huge exponent
        "1e999",  # a JSON number that is infinite
        "NaN",  # JSON's NaN extension
        '"Infinity"',
        '"inf"',
        '"' + "9" * 10_000 + '"',  # ten thousand digits as text
        "1" + "0" * 5000,  # a JSON integer past Python's 4300-digit conversion limit
        '"#### 1e999999999"',  # a solution whose final line is not a plain number (it is not 1)
        "true",  # a JSON boolean
        "[1]",  # a list
        "[" * 100_000,  # nested past Python's recursion limit
    ],
)
def test_uploaded_answers_that_are_not_numbers_name_their_row(answer):
    import time

    raw = f'{{"question": "ok?", "answer": "3"}}\n{{"question": "q?", "answer": {answer}}}\n'.encode()
    t = time.perf_counter()
    with pytest.raises(DataError, match="line 2: .*not .*(number|JSON)"):
        parse_custom_dataset(raw, "d.jsonl")
    assert time.perf_counter() - t < 0.5
    csv_value = answer.strip('"')
    if len(csv_value) < 1000:  # (csv's own field limit is tested below)
        with pytest.raises(DataError, match="row 3: answer .* is not a number"):
            parse_custom_dataset(f"question,answer\nok?,3\nq?,{csv_value}\n".encode(), "d.csv")


def test_csv_that_the_csv_module_refuses_is_a_clear_error():
    big = b"question,answer\nq?," + b"9" * 200_000 + b"\n"  # over csv's field size limit
    with pytest.raises(DataError, match="row .*not readable as CSV"):
        parse_custom_dataset(big, "d.csv")


# ---- a stage's own list of GSM8K train problems (stage.problem_ids) -----------------------------
def _ids_file(tmp_path, *lines):
    path = tmp_path / "ids.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_stage_trains_on_the_listed_problems_in_file_order(tmp_path):
    ids = _ids_file(tmp_path, "# a comment", "gsm8k-train-5", "", "gsm8k-train-0", "gsm8k-train-17")
    stage = StageConfig(name="listed", source="gsm8k", min_difficulty=0, max_difficulty=99, num_problems=8,
                        problem_ids=ids)
    pool = stage_pool(stage, DataConfig(), seed=0)
    train, _ = load_gsm8k("train", DataConfig())
    assert [p.id for p in pool.problems] == ["gsm8k-train-5", "gsm8k-train-0", "gsm8k-train-17"]
    assert [p.question for p in pool.problems] == [train[5].question, train[0].question, train[17].question]
    assert pool.source == "gsm8k" and "ids.txt" in pool.origin
    # scoring still uses the test split: the list names train rows only
    held = heldout_pool(stage, DataConfig(), n=10, seed=0)
    assert len(held.problems) == 10 and all(p.id.startswith("gsm8k-test-") for p in held.problems)


def test_a_list_that_does_not_match_the_train_split_is_an_error(tmp_path):
    ids = _ids_file(tmp_path, "gsm8k-train-3", "gsm8k-train-999999")
    stage = StageConfig(name="listed", source="gsm8k", num_problems=8, problem_ids=ids)
    with pytest.raises(DataError, match=r"1 of the 2 problems in ids.txt are not in GSM8K train .*gsm8k-train-999999"):
        stage_pool(stage, DataConfig(), seed=0)


@pytest.mark.parametrize(
    "lines, message",
    [
        (("gsm8k-train-1", "gsm8k-test-2"), "line 2: 'gsm8k-test-2' is not a GSM8K train id"),
        (("gsm8k-train-1", "gsm8k-train-1"), "line 2: gsm8k-train-1 is listed twice"),
        (("# only a comment",), "lists no problem ids"),
    ],
)
def test_a_bad_problem_list_is_refused_by_the_config_check(tmp_path, lines, message):
    from grpo_app.core.config import ConfigError, load_config

    ids = _ids_file(tmp_path, *lines)
    with pytest.raises(ConfigError, match=message):
        load_config("tests/configs/tiny.yaml", ["stages[0].source=gsm8k", f"stages[0].problem_ids={ids}"])


def test_a_problem_list_needs_a_gsm8k_stage_and_a_file(tmp_path):
    from grpo_app.core.config import ConfigError, load_config

    ids = _ids_file(tmp_path, "gsm8k-train-1")
    with pytest.raises(ConfigError, match="lists GSM8K problems but the source is 'arithmetic'"):
        load_config("tests/configs/tiny.yaml", [f"stages[0].problem_ids={ids}"])
    with pytest.raises(ConfigError, match="cannot be read .no such file."):
        load_config("tests/configs/tiny.yaml", ["stages[0].source=gsm8k", f"stages[0].problem_ids={tmp_path}/none.txt"])


def test_the_gsm8k_preset_trains_on_the_teachable_problems_the_ceiling_found():
    """configs/gsm8k.yaml names configs/gsm8k_teachable.txt (found beside the presets): exactly the train
    problems that bench/gsm8k_solvable.py's recorded ceiling found teachable (1..k-1 right of k)."""
    import json

    from grpo_app.core.config import PROJECT_ROOT, load_config, read_problem_ids

    cfg = load_config("gsm8k")
    (stage,) = cfg.stages
    ids = read_problem_ids(stage.problem_ids)
    ceiling = json.loads((PROJECT_ROOT / "assets" / "gsm8k_solvable_gpu.json").read_text())["ceiling"]
    teachable = {r["id"] for r in ceiling["records"] if 0 < r["correct"] < ceiling["k"]}
    assert set(ids) == teachable and len(ids) == stage.num_problems == 122
    pool = stage_pool(stage, cfg.data, seed=cfg.data.seed)
    assert sorted(p.id for p in pool.problems) == sorted(ids)


@pytest.mark.parametrize("a, b, same", [
    ("Calculate 12 + 7.", "Calculate 7 + 12.", True),  # commuted sum
    ("Calculate 88 + 94 - 83.", "Calculate 94 - 83 + 88.", True),  # signed terms in another order
    ("Calculate 9 - 4.", "Calculate -4 + 9.", True),
    ("Calculate 9 - 4.", "Calculate 4 - 9.", False),  # not a reordering: another value
    ("Calculate 5 * 3.", "Calculate 3 * 5.", True),  # commuted product
    ("Calculate 3 * 4 + 2.", "Calculate 2 + 4 * 3.", False),  # mixed operators are left as written
    ("Calculate ( -9 * 8 ).", "Calculate ( 8 * -9 ).", False),  # parentheses too
    ("Calculate  12 +  7.", "Calculate 12 + 7.", True),  # whitespace
    ("Sam has 3 apples and 4 pears.", "Sam has 4 apples and 3 pears.", False),  # words: no expression
])
def test_question_key_folds_commuted_terms(a, b, same):
    from grpo_app.core.data import question_key

    assert (question_key(a) == question_key(b)) is same


def test_replay_mixes_a_share_of_the_earlier_stages_problems_in():
    """Issue 42, goal 4: stages[k].replay of stage k's training problems come from the earlier stages' pools."""
    from grpo_app.core.config import load_config
    from grpo_app.core.data import stage_pool, with_replay

    cfg = load_config("tests/configs/tiny.yaml", ["stages[1].replay=0.25", "stages[1].num_problems=16"])
    own = stage_pool(cfg.stages[1], cfg.data, seed=cfg.data.seed + 1).problems
    earlier = {p.id for p in stage_pool(cfg.stages[0], cfg.data, seed=cfg.data.seed).problems}
    mixed = with_replay(cfg.stages, 1, cfg.data, 5, own)
    assert len(mixed) == len(own) == 16
    assert sum(p.id in earlier for p in mixed) == 4  # a quarter, from stage 1's pool
    # in training order, spread evenly: every four prompts hold one (a short stage trains on a prefix)
    assert [sum(p.id in earlier for p in mixed[i:i + 4]) for i in range(0, 16, 4)] == [1, 1, 1, 1]
    assert {p.id for p in mixed} - earlier <= {p.id for p in own}
    assert [p.id for p in with_replay(cfg.stages, 1, cfg.data, 5, own)] == [p.id for p in mixed]  # seeded
    assert with_replay(cfg.stages, 0, cfg.data, 5, own) == own  # stage 1 has nothing to replay
    cfg0 = load_config("tests/configs/tiny.yaml", [])
    assert with_replay(cfg0.stages, 1, cfg0.data, 5, own) == own  # replay 0: the stage's own problems


@pytest.mark.parametrize("override, words", [
    ("stages[0].replay=0.2", "the first stage has no earlier stage to replay"),
    ("stages[1].replay=0.95", "is a share: 0 to 0.9"),
])
def test_replay_is_checked(override, words):
    from grpo_app.core.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config("tests/configs/tiny.yaml", [override])
    assert any("replay" in p and words in m for p, m in err.value.errors), err.value.errors


def test_word_problems_are_one_step_stories_with_the_right_answer():
    from grpo_app.core.data import heldout_pool, make_word_problems, stage_pool

    probs = make_word_problems(200, seed=3, max_digits=2, operators="+-")
    assert make_word_problems(200, seed=3) == probs and make_word_problems(200, seed=4) != probs  # seeded
    assert make_word_problems(5, seed=3) == probs[:5]  # item i depends on (seed, i) only
    ops = set()
    for p in probs:
        a, op, b = re.fullmatch(r"(\d+) ([+-]) (\d+) = -?\d+\n#### -?\d+", p.solution).groups()
        assert f" {a} " in f" {p.question} " and f" {b} " in f" {p.question} ".replace(".", " ")
        want = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert p.answer == str(want) and want >= 0 and p.difficulty == 1 and p.source == "word"
        assert int(a) <= 99 and int(b) <= 99
        ops.add(op)
    assert ops == {"+", "-"}
    assert {p.solution.split()[1] for p in make_word_problems(50, 1, operators="-")} == {"-"}
    stage = StageConfig(name="w", source="word", max_digits=2, operators="+-", num_problems=64)
    pool = stage_pool(stage, DataConfig(), seed=0)
    assert len(pool.problems) == 64 and pool.source == "word"
    held = heldout_pool(stage, DataConfig(), 50, seed=0, exclude_questions={p.question for p in pool.problems})
    assert len(held.problems) == 50 and not {p.question for p in held.problems} & {p.question for p in pool.problems}


def test_two_step_word_problems_chain_two_operations_and_never_go_below_one():
    """Difficulty 2 of the word source: two events in one story; the worked solution's two lines use the numbers
    of the question in order, the answer is their result, and a one-step-only draw is unchanged by the option."""
    from grpo_app.core.data import make_word_problems, stage_pool

    probs = make_word_problems(300, seed=5, max_digits=1, operators="+-", min_steps=2, max_steps=2)
    kinds = set()
    for p in probs:
        a, o1, b, mid, mid2, o2, c, end, gold = re.fullmatch(
            r"(\d+) ([+-]) (\d+) = (\d+)\n(\d+) ([+-]) (\d+) = (\d+)\n#### (\d+)", p.solution).groups()
        nums = re.findall(r"\d+", p.question)
        assert nums == [a, b, c] and mid == mid2 and end == gold == p.answer and p.difficulty == 2
        assert int(mid) == (int(a) + int(b) if o1 == "+" else int(a) - int(b)) >= 1
        assert int(end) == (int(mid) + int(c) if o2 == "+" else int(mid) - int(c)) >= 1
        assert max(int(a), int(b), int(c)) <= 9
        kinds.add(o1 + o2)
    assert kinds == {"++", "+-", "-+", "--"}
    only_plus = make_word_problems(50, seed=5, max_digits=1, operators="+", min_steps=2, max_steps=2)
    assert {p.solution.split()[1] + p.solution.split()[6] for p in only_plus} == {"++"}
    mixed = make_word_problems(400, seed=5, max_digits=1, min_steps=1, max_steps=2)
    assert {p.difficulty for p in mixed} == {1, 2}
    one = StageConfig(name="w", source="word", min_difficulty=1, max_difficulty=1, max_digits=1, num_problems=40)
    two = StageConfig(name="w", source="word", min_difficulty=2, max_difficulty=2, max_digits=1, num_problems=40)
    assert stage_pool(one, DataConfig(), seed=0).problems == make_word_problems(40, 0, 1, "+-")
    pool = stage_pool(two, DataConfig(), seed=0)
    assert {p.difficulty for p in pool.problems} == {2} and pool.origin.startswith("two-step word problems")


def test_equal_groups_word_problems_multiply_and_divide_whole():
    from grpo_app.core.data import make_word_problems

    probs = make_word_problems(200, seed=2, max_digits=1, operators="*/")
    ops = set()
    for p in probs:
        a, op, b, gold = re.fullmatch(r"(\d+) ([*/]) (\d+) = (\d+)\n#### \d+", p.solution).groups()
        assert re.findall(r"\d+", p.question) == [a, b] and p.answer == gold and p.difficulty == 1
        if op == "*":
            assert int(gold) == int(a) * int(b)
        else:
            assert int(gold) * int(b) == int(a)
        assert 2 <= int(b) <= 9 and (op == "/" or 2 <= int(a) <= 9) and int(gold) >= 2
        ops.add(op)
    assert ops == {"*", "/"}


def test_even_differences_make_every_take_away_answer_equally_common():
    """The default one-digit take-away stories answer 1 a third of the time (always writing 1 scores ~30%);
    even_differences draws the difference first, so each of 1..8 is about 1 in 8, the stories stay right, and the
    option leaves adding stories and the default draw as they were."""
    from collections import Counter

    from grpo_app.core.data import heldout_pool, make_word_problems, stage_pool

    plain = make_word_problems(800, seed=3, max_digits=1, operators="-")
    even = make_word_problems(800, seed=3, max_digits=1, operators="-", even_differences=True)
    share = {name: Counter(p.answer for p in probs) for name, probs in (("plain", plain), ("even", even))}
    assert share["plain"]["1"] / 800 > 0.3  # the skew the option removes
    assert set(share["even"]) == {str(d) for d in range(1, 9)}
    assert all(60 <= c <= 140 for c in share["even"].values()), share["even"]  # 100 each expected
    for p in even:
        a, b = re.fullmatch(r"(\d) - (\d) = \d\n#### \d", p.solution).groups()
        assert int(a) - int(b) == int(p.answer) >= 1 and 1 <= int(b) and int(a) <= 9
        assert f" {a} " in f" {p.question} " and f" {b} " in f" {p.question} ".replace(".", " ")
    two = make_word_problems(300, seed=3, max_digits=2, operators="-", even_differences=True)
    assert max(int(p.answer) for p in two) > 80 and all(int(p.solution.split()[0]) <= 99 for p in two)
    assert make_word_problems(200, 3, 1, "+", even_differences=True) == make_word_problems(200, 3, 1, "+")
    stage = StageConfig(name="w", source="word", max_difficulty=1, max_digits=1, operators="-", num_problems=64,
                        even_differences=True)
    pool = stage_pool(stage, DataConfig(), seed=0)
    assert pool.problems == make_word_problems(64, 0, 1, "-", even_differences=True) and "even" in pool.origin
    held = heldout_pool(stage, DataConfig(), 100, seed=1000, exclude_questions={p.question for p in pool.problems})
    assert Counter(p.answer for p in held.problems).most_common(1)[0][1] <= 25  # held-out problems follow the option


@pytest.mark.parametrize(("overrides", "words"), [
    (["even_differences=true"], "take away"),  # a stage with '+-' is fine, '+' alone has nothing to take away
    (["max_digits=5"], "1..4"),
    (["operators='%'"], "+ - * /"),
    (["operators='*'", "max_difficulty=2"], "two-step word problems add and subtract"),
    (["max_difficulty=3"], "1 or 2 steps"),
])
def test_word_stage_options_are_checked(overrides, words):
    from grpo_app.core.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(words)):
        load_config("quick", ["stages[0].source=word", *(f"stages[0].{o}" for o in overrides)])
    if overrides[0] == "even_differences=true":
        load_config("quick", ["stages[0].source=word", "stages[0].operators='+-'", "stages[0].even_differences=true"])
        with pytest.raises(ConfigError, match="source: word"):
            load_config("quick", ["stages[0].source=arithmetic", "stages[0].even_differences=true"])
    if overrides[0] == "operators='*'":  # equal groups in one step are fine
        load_config("quick", ["stages[0].source=word", "stages[0].operators='*/'", "stages[0].max_difficulty=1"])
