"""Rewards of your own (issue 44): declarative rules that run no code, and Python functions by import path.

**Declarative** (`rewards.custom` in YAML, the "Rewards of your own" table on the page): a name and one rule,
each paying 1.0 when it holds and 0.0 when not:

* `answer_within` (`tolerance` ≥ 0): the number on the answer line (`#### n`, the one answer reader) is within
  `tolerance` of the gold answer (0 = exactly; a completion without an answer line gets 0);
* `regex` (`pattern`, `must: match | absent`): a regular expression (at most 200 characters, the `regex`
  package's syntax) matches somewhere in the completion, or must not. It is matched with the `regex`
  package's `timeout` (0.05 s per completion, which works off the main thread, unlike `signal`), so a
  pattern built to backtrack for ever pays 0 instead of stalling a shared server;
* `length` (`min_tokens`, `max_tokens`): the completion's length in tokens (the ids TRL passes while training;
  elsewhere, e.g. What if? on a reward the run did not record, words and punctuation marks counted as a
  stand-in) lies in the band;
* `word` (`word`, `must: present | absent`): a word (letters, digits, spaces; whole word, any case) occurs, or
  must not.

**Python** (`rewards.functions: ["pkg.mod:func"]`, YAML and CLI only, as `trl grpo --reward_funcs`): a
function with TRL's reward signature `f(prompts, completions, **columns) -> list[float]`, named by what follows
the colon. It is imported and called once on a sample completion when the config is checked, so a bad path or a
function that raises is reported naming the reward before any model loads; while training, an exception is
re-raised with the reward's name. The web app refuses a config with Python rewards unless the server was
started with GRPO_APP_ALLOW_CODE_REWARDS=1 (a shared server must not run its users' code).
"""

from __future__ import annotations

import importlib
import math
import os
import re
from collections.abc import Callable

from grpo_app.core.answers import extract_final_answer, normalize_number

RULES = ("answer_within", "regex", "length", "word")
MAX_CUSTOM = 8  # declarative rewards per config
MAX_PATTERN = 200  # characters of a regular expression
MAX_TEXT = 4000  # characters of a completion a rule reads
REGEX_TIMEOUT_S = 0.05
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
WORD_RE = re.compile(r"^[\w ]{1,40}$")
PATH_RE = re.compile(r"^[A-Za-z_][\w.]{0,199}:[A-Za-z_]\w{0,99}$")
CODE_FLAG = "GRPO_APP_ALLOW_CODE_REWARDS"


class RewardError(RuntimeError):
    """A reward of one's own that cannot be built or that failed: the message names it."""


def _text(completion) -> str:
    from grpo_app.core.rewards import completion_text

    return completion_text(completion)[:MAX_TEXT]


def _num(value, path: str, errors: list, lo: float = 0.0) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < lo:
        errors.append((path, f"must be a number of at least {lo:g}, got {str(value)[:40]!r}."))
        return None
    return float(value)


def check_rule(spec, where: str) -> list[tuple[str, str]]:
    """Problems of one declarative reward (`where`: its place in the config, e.g. 'custom[0]')."""
    if not isinstance(spec, dict):
        return [(where, "must be a mapping like {name: shows_work, rule: regex, pattern: '=', must: match}.")]
    e: list[tuple[str, str]] = []
    name, rule = spec.get("name"), spec.get("rule")
    if not isinstance(name, str) or not NAME_RE.match(name):
        e.append((f"{where}.name", "a name of lower-case letters, digits and _ (up to 40), starting with a letter, "
                                   f"e.g. shows_work; got {str(name)[:40]!r}."))
    if rule not in RULES:
        e.append((f"{where}.rule", f"{str(rule)[:40]!r} is not one of {', '.join(RULES)}."))
        return e
    allowed = {"answer_within": {"tolerance"}, "regex": {"pattern", "must"}, "length": {"min_tokens", "max_tokens"},
               "word": {"word", "must"}}[rule] | {"name", "rule"}
    for key in spec:
        if key not in allowed:
            e.append((f"{where}.{key}", f"not a setting of the {rule} rule (it takes {', '.join(sorted(allowed - {'name', 'rule'}))})."))
    if rule == "answer_within":
        _num(spec.get("tolerance", 0.0), f"{where}.tolerance", e)
    elif rule == "regex":
        pattern = spec.get("pattern")
        if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN:
            e.append((f"{where}.pattern", f"a regular expression of 1 to {MAX_PATTERN} characters."))
        else:
            import regex

            try:
                regex.compile(pattern)
            except (regex.error, ValueError, OverflowError, RecursionError) as err:
                e.append((f"{where}.pattern", f"not a regular expression: {str(err)[:80]}."))
        if spec.get("must", "match") not in ("match", "absent"):
            e.append((f"{where}.must", "match or absent."))
    elif rule == "length":
        lo = _num(spec.get("min_tokens", 0), f"{where}.min_tokens", e)
        hi = _num(spec.get("max_tokens", 10**6), f"{where}.max_tokens", e)
        if lo is not None and hi is not None and hi < lo:
            e.append((f"{where}.max_tokens", f"the band {lo:g}..{hi:g} is empty (max below min)."))
    elif rule == "word":
        word = spec.get("word")
        if not isinstance(word, str) or not WORD_RE.match(word.strip() or "-"):
            e.append((f"{where}.word", "a word or phrase of letters, digits and spaces (up to 40)."))
        if spec.get("must", "present") not in ("present", "absent"):
            e.append((f"{where}.must", "present or absent."))
    return e


def _approx_tokens(text: str) -> int:
    return len(re.findall(r"\w+|[^\w\s]", text))


def rule_reward(spec: dict) -> Callable:
    """The TRL reward function of a checked declarative reward."""
    rule, name = spec["rule"], spec["name"]

    if rule == "answer_within":
        tol = float(spec.get("tolerance", 0.0))

        def fn(prompts, completions, answer=None, **kw):
            out = []
            for c, gold in zip(completions, answer or [None] * len(completions)):
                pred, g = extract_final_answer(_text(c)), normalize_number(str(gold)) if gold is not None else None
                try:
                    out.append(1.0 if pred is not None and g is not None and abs(float(pred) - float(g)) <= tol else 0.0)
                except (TypeError, ValueError, OverflowError):
                    out.append(0.0)
            return out

        doc = f"1 if the answer line's number is within {tol:g} of the gold answer."
    elif rule == "regex":
        import regex

        compiled, must = regex.compile(spec["pattern"]), spec.get("must", "match")

        def fn(prompts, completions, **kw):
            out = []
            for c in completions:
                try:
                    hit = compiled.search(_text(c), timeout=REGEX_TIMEOUT_S) is not None
                except TimeoutError:  # a pattern that backtracks for ever pays nothing
                    out.append(0.0)
                    continue
                out.append(1.0 if hit == (must == "match") else 0.0)
            return out

        doc = f"1 if /{spec['pattern'][:40]}/ {'matches' if must == 'match' else 'does not match'} (regex, time-limited)."
    elif rule == "length":
        lo, hi = float(spec.get("min_tokens", 0)), float(spec.get("max_tokens", 10**6))

        def fn(prompts, completions, completion_ids=None, **kw):
            out = []
            for i, c in enumerate(completions):
                n = len(completion_ids[i]) if completion_ids is not None else _approx_tokens(_text(c))
                out.append(1.0 if lo <= n <= hi else 0.0)
            return out

        doc = f"1 if the answer is {lo:g} to {hi:g} tokens long."
    else:
        word, must = spec["word"].strip(), spec.get("must", "present")
        pat = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE)

        def fn(prompts, completions, **kw):
            return [1.0 if (pat.search(_text(c)) is not None) == (must == "present") else 0.0 for c in completions]

        doc = f"1 if the word '{word}' is {'present' if must == 'present' else 'absent'}."
    fn.__name__ = name
    fn.__doc__ = f"{doc} (a rule of your own)"
    return fn


# ---- Python rewards by import path -----------------------------------------------------------------------
def python_name(path: str) -> str:
    return str(path).rpartition(":")[2]


def load_python_reward(path: str) -> Callable:
    """The function at 'pkg.mod:func', wrapped so an exception names the reward; RewardError when it cannot."""
    if not isinstance(path, str) or not PATH_RE.match(path):
        raise RewardError(f"reward {str(path)[:60]!r}: write it as 'package.module:function'.")
    mod, _, attr = path.partition(":")
    try:
        fn = getattr(importlib.import_module(mod), attr)
    except ImportError as e:
        raise RewardError(f"reward {path}: cannot import {mod} ({str(e)[:120]}).") from None
    except AttributeError:
        raise RewardError(f"reward {path}: {mod} has no function {attr}.") from None
    except Exception as e:  # noqa: BLE001 - the module itself failed while importing
        raise RewardError(f"reward {path}: importing {mod} failed: {type(e).__name__}: {str(e)[:120]}.") from None
    if not callable(fn):
        raise RewardError(f"reward {path}: {attr} is not a function.")

    def wrapped(prompts, completions, **kw):
        try:
            out = fn(prompts, completions, **kw)
        except Exception as e:  # noqa: BLE001 - re-raised with the reward's name
            raise RewardError(f"reward {path} raised {type(e).__name__}: {str(e)[:200]}") from e
        return out

    wrapped.__name__ = attr
    wrapped.__doc__ = ((fn.__doc__ or "").strip().splitlines() or [f"Python reward {path}."])[0] + " (Python, " + path + ")"
    return wrapped


def probe(fn: Callable, name: str) -> None:
    """Call a reward once on a sample completion; RewardError (naming it) when it raises or returns no list of
    one number per completion."""
    try:
        out = fn(prompts=[[{"role": "user", "content": "What is 2 + 3?"}]],
                 completions=[[{"role": "assistant", "content": "2 + 3 = 5\n#### 5"}]],
                 answer=["5"], question=["What is 2 + 3?"], difficulty=[1], completion_ids=[[1, 2, 3]])
    except RewardError:
        raise
    except Exception as e:  # noqa: BLE001
        raise RewardError(f"reward {name} raised {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(out, (list, tuple)) or len(out) != 1 or not (out[0] is None or isinstance(out[0], (int, float))):
        raise RewardError(f"reward {name} must return a list with one number (or None) per completion; "
                          f"returned {str(out)[:80]}.")


def code_rewards_allowed() -> bool:
    return os.environ.get(CODE_FLAG, "").strip() == "1"


# ---- the registry of one config ------------------------------------------------------------------------
def reward_functions(rewards_cfg, python: bool = True) -> dict[str, Callable]:
    """name -> function: the built-in rewards, the config's declarative ones and (with `python`) its Python
    ones. Call it on a checked config."""
    from grpo_app.core.rewards import REWARD_FUNCS

    funcs = dict(REWARD_FUNCS)
    for spec in getattr(rewards_cfg, "custom", None) or []:
        funcs[spec["name"]] = rule_reward(spec)
    if python:
        for path in getattr(rewards_cfg, "functions", None) or []:
            funcs[python_name(path)] = load_python_reward(path)
    return funcs
