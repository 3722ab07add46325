"""Rewards of your own (issue 44, item 2): declarative rules (no code), a hostile regular expression that cannot
stall the server, Python rewards by import path with clear messages (a bad path, a function that raises, before
any model loads), the page's refusal of code, and a real tiny training run that records a rule's rewards."""

import textwrap
import threading
import time

import pytest
import yaml

from grpo_app.core import custom_rewards as cr
from grpo_app.core.config import ConfigError, load_config
from grpo_app.core.custom_rewards import RewardError, check_rule, load_python_reward, reward_functions, rule_reward


def fn(spec):
    assert check_rule(spec, "custom[0]") == []
    return rule_reward(spec)


def test_answer_within_reads_the_answer_line():
    f = fn({"name": "close", "rule": "answer_within", "tolerance": 0.5})
    assert f([""] * 4, ["#### 10.4", "#### 11", "the answer is 10", "#### 1,0"], answer=["10"] * 4) == [1.0, 0.0, 0.0, 0.0]
    exact = fn({"name": "exact", "rule": "answer_within"})
    assert exact([""] * 2, ["#### 7", "#### 7.01"], answer=["7", "7"]) == [1.0, 0.0]


def test_regex_word_and_length_rules():
    shows = fn({"name": "shows_work", "rule": "regex", "pattern": r"\d+ [-+] \d+ = \d+", "must": "match"})
    assert shows([""] * 2, ["3 + 4 = 7\n#### 7", "#### 7"]) == [1.0, 0.0]
    no_code = fn({"name": "no_code", "rule": "regex", "pattern": "```", "must": "absent"})
    assert no_code([""] * 2, ["```py\nprint(7)```", "#### 7"]) == [0.0, 1.0]
    polite = fn({"name": "polite", "rule": "word", "word": "Answer", "must": "present"})
    assert polite([""] * 3, ["The answer: 7", "answers 7", "ANSWER 7"]) == [1.0, 0.0, 1.0]  # whole word, any case
    short = fn({"name": "short", "rule": "length", "min_tokens": 2, "max_tokens": 4})
    assert short([""] * 3, ["a", "b", "c"], completion_ids=[[1], [1, 2, 3], [1] * 9]) == [0.0, 1.0, 0.0]
    assert short([""] * 2, ["#### 7", "one, two"]) == [0.0, 1.0]  # no ids: words and marks counted (5, 3)
    assert shows.__name__ == "shows_work" and "a rule of your own" in shows.__doc__


def test_a_hostile_pattern_pays_nothing_and_returns_quickly_off_the_main_thread():
    evil = fn({"name": "evil", "rule": "regex", "pattern": r"(a|aa)+$", "must": "match"})  # backtracks for ever
    out, spent = [], []

    def work():
        t0 = time.perf_counter()
        out.extend(evil([""] * 3, ["a" * 30 + "b", "aaa", "b" * 100 + "a" * 3000 + "!"]))
        spent.append(time.perf_counter() - t0)

    t = threading.Thread(target=work)  # the training thread of the app: no signals there
    t.start()
    t.join(20)
    assert not t.is_alive(), "the pattern stalled the thread"
    assert out == [0.0, 1.0, 0.0] and spent[0] < 3 * 10 * cr.REGEX_TIMEOUT_S  # two timeouts, not a stall


@pytest.mark.parametrize("spec,where,words", [
    ({"name": "x", "rule": "vibes"}, "custom[0].rule", "not one of answer_within, regex, length, word"),
    ({"name": "Bad Name", "rule": "word", "word": "hi"}, "custom[0].name", "lower-case"),
    ({"name": "p", "rule": "regex", "pattern": "a" * 201}, "custom[0].pattern", "1 to 200"),
    ({"name": "p", "rule": "regex", "pattern": "(unclosed"}, "custom[0].pattern", "not a regular expression"),
    ({"name": "p", "rule": "regex", "pattern": "a", "must": "maybe"}, "custom[0].must", "match or absent"),
    ({"name": "p", "rule": "length", "min_tokens": 9, "max_tokens": 3}, "custom[0].max_tokens", "is empty"),
    ({"name": "p", "rule": "answer_within", "tolerance": -1}, "custom[0].tolerance", "at least 0"),
    ({"name": "p", "rule": "word", "word": "<script>"}, "custom[0].word", "letters, digits and spaces"),
    ({"name": "p", "rule": "word", "word": "hi", "pattern": "x"}, "custom[0].pattern", "not a setting of the word rule"),
])
def test_bad_rules_name_the_field_and_the_fix(spec, where, words):
    problems = check_rule(spec, "custom[0]")
    assert any(p == where and words in m for p, m in problems), problems


def write_config(tmp_path, rewards: dict) -> str:
    data = yaml.safe_load(open("tests/configs/tiny.yaml"))
    data["rewards"] = rewards
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_config_weights_its_own_rewards_and_refuses_clashes_and_unknown_names(tmp_path):
    cfg = load_config(write_config(tmp_path, {
        "weights": {"correctness": 1.0, "shows_work": 0.5},
        "custom": [{"name": "shows_work", "rule": "regex", "pattern": "=", "must": "match"}]}))
    funcs = reward_functions(cfg.rewards)
    assert funcs["shows_work"]([""], ["1 + 1 = 2"]) == [1.0] and "correctness" in funcs
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path, {"weights": {"correctness": 1.0},
                                            "custom": [{"name": "correctness", "rule": "word", "word": "x"}]}))
    assert "is taken" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path, {"weights": {"correctness": 1.0, "shows_wrk": 1.0},
                                            "custom": [{"name": "shows_work", "rule": "word", "word": "x"}]}))
    assert "Did you mean 'shows_work'" in str(e.value)


MODULE = '''
def digits(prompts, completions, **kw):
    """1 per completion that contains a digit."""
    return [1.0 if any(ch.isdigit() for ch in str(c)) else 0.0 for c in completions]

def broken(prompts, completions, **kw):
    raise ZeroDivisionError("oops")
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_python_rewards_by_import_path(tmp_path, user_module):
    cfg = load_config(write_config(tmp_path, {"weights": {"correctness": 1.0, "digits": 0.5},
                                              "functions": [f"{user_module}:digits"]}))
    f = reward_functions(cfg.rewards)["digits"]
    assert f([""] * 2, ["#### 4", "four"]) == [1.0, 0.0] and "(Python, my_rewards:digits)" in f.__doc__
    for path, words in (("my_rewards:nope", "has no function nope"), ("no_such_mod:f", "cannot import no_such_mod"),
                        ("not a path", "package.module:function"), (f"{user_module}:broken", "raised ZeroDivisionError")):
        with pytest.raises(ConfigError) as e:
            load_config(write_config(tmp_path, {"weights": {"correctness": 1.0}, "functions": [path]}))
        assert words in str(e.value) and "functions[0]" in str(e.value), str(e.value)
    wrapped = load_python_reward(f"{user_module}:broken")
    with pytest.raises(RewardError, match="reward my_rewards:broken raised ZeroDivisionError: oops"):
        wrapped([""], ["x"])


def test_the_page_refuses_python_rewards_unless_the_server_allows_code(tmp_path, user_module, monkeypatch):
    from grpo_app.ui import forms

    from .test_forms import base_form

    data = forms.load_preset_data("tests/configs/app/tiny-app.yaml")
    data["rewards"] = {"weights": {"correctness": 1.0, "digits": 1.0}, "functions": [f"{user_module}:digits"]}
    monkeypatch.delenv(cr.CODE_FLAG, raising=False)
    with pytest.raises(forms.FormError) as e:
        forms.build_config(base_form(), data, [tmp_path / "models"])
    assert any(cr.CODE_FLAG in m and "my_rewards:digits" in m for _, m in e.value.errors)
    monkeypatch.setenv(cr.CODE_FLAG, "1")
    cfg = forms.build_config(base_form(), data, [tmp_path / "models"])
    assert cfg.rewards.functions == [f"{user_module}:digits"]


@pytest.mark.slow
def test_a_tiny_run_trains_on_a_rule_and_records_it(tmp_path):
    from .test_step_history import _tiny_run

    run = _tiny_run(tmp_path / "runs", "rewards.weights={correctness: 1.0, has_number: 0.5, digit_words: 1.0}",
                    "rewards.custom=[{name: digit_words, rule: length, min_tokens: 1, max_tokens: 12}]")
    steps = run.steps()
    assert steps and all("digit_words" in g["rewards"] for s in steps for g in s["groups"])
    assert all(set(g["rewards"]["digit_words"]) <= {0.0, 1.0} for s in steps for g in s["groups"])


def test_the_pages_table_becomes_rules_and_weights_and_bad_rows_are_routed(tmp_path):
    from grpo_app.ui import forms

    from .test_forms import base_form

    roots = [tmp_path / "models"]
    data = forms.load_preset_data("tests/configs/app/tiny-app.yaml")
    table = [["shows_work", 0.5, "regex", r"\d+ = \d+", ""], ["close", 1, "answer_within", "0.5", ""],
             ["short", 0.2, "length", "5-60", ""], ["no_code", 0.3, "word", "python", "absent"], ["", "", "", "", ""]]
    cfg = forms.build_config(base_form(custom_rewards=table), data, roots)
    assert [s["name"] for s in cfg.rewards.custom] == ["shows_work", "close", "short", "no_code"]
    assert cfg.rewards.custom[2] == {"name": "short", "rule": "length", "min_tokens": 5.0, "max_tokens": 60.0}
    assert cfg.rewards.weights["shows_work"] == 0.5 and cfg.rewards.weights["correctness"] == 1.0  # preset's kept
    assert forms.parse_custom_rewards(forms.reward_rows(cfg.rewards.custom, cfg.rewards.weights), []) == (
        cfg.rewards.custom, {k: cfg.rewards.weights[k] for k in ("shows_work", "close", "short", "no_code")})
    with pytest.raises(forms.FormError) as e:
        forms.build_config(base_form(custom_rewards=[["evil", 1, "regex", "(a" * 150, ""], ["X y", 1, "word", "hi", ""],
                                                     ["t", "heavy", "vibes", "", ""]]), data, roots)
    routed = forms.route_errors(e.value.errors)
    text = " ".join(routed["rewards"])
    assert "1 to 200" in text and "lower-case" in text and "not one of answer_within" in text and "weight" in text
    assert set(routed) == {"rewards"}
    assert forms.build_config(base_form(custom_rewards=[]), data, roots).rewards.custom == []  # empty: the preset's
