"""Reward functions with TRL's signature: f(prompts, completions, **dataset_columns) -> list[float].

They are pure (no state, no I/O, no `signal`), so they run in the training thread and are trivial
to test. Each one is logged separately by TRL under `rewards/<name>/mean`. Answers are read by the
same extractor the evaluation uses (`answers.extract_answer`).

math-verify is used only as a fallback for answers our numeric parser cannot read (LaTeX fractions,
'\\boxed{..}'), with its signal-based timeouts disabled (`parsing_timeout=None`,
`timeout_seconds=None`) because signals fail off the main thread; inputs are capped in length instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from grpo_app.core.answers import (
    FINAL_MARK_RE,
    answers_match,
    extract_answer,
    extract_final_answer,
    has_final_line,
    question_numbers,
    written_calculations,
)

_MATH_VERIFY_MAX_CHARS = 200


def completion_text(completion) -> str:
    """TRL passes conversational completions as [{'role': 'assistant', 'content': ...}]."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    return str(completion)


def _math_verify_equal(text: str, gold: str, allow_boxed: bool) -> bool:
    """math-verify on the text after the last '####' (or a \\boxed{} when allowed), without signal timeouts."""
    tail = text.rsplit("####", 1)[-1].strip() if "####" in text else ""
    if not tail and allow_boxed:
        m = re.search(r"\\boxed\{([^{}]{1,60})\}", text)
        tail = m.group(0) if m else ""
    tail = tail[:_MATH_VERIFY_MAX_CHARS]
    if not tail:
        return False
    try:
        from math_verify import parse, verify

        g = parse(gold, parsing_timeout=None)
        p = parse(tail if tail.startswith("\\boxed") else f"${tail}$", parsing_timeout=None)
        return bool(p) and bool(verify(g, p, timeout_seconds=None))
    except Exception:
        return False


def is_correct(text: str, gold: str, strict: bool = True) -> bool:
    """Is the final answer right? strict (training): only a '####' answer counts; otherwise the
    last number (or a \\boxed{} answer) is accepted too, as flexible GSM8K scoring does."""
    pred, how = extract_answer(text, fallback=not strict)
    if pred is not None and answers_match(pred, gold):
        return True
    if how == "marker":
        return False
    # No numeric '####' answer: let math-verify read forms like '#### \\frac{3}{4}' or '\\boxed{..}'.
    return ("####" in text or (not strict and "\\boxed" in text)) and _math_verify_equal(text, gold, not strict)


def correctness(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the number after the last '####' equals the gold answer, else 0.0."""
    return [1.0 if is_correct(completion_text(c), a, strict=True) else 0.0 for c, a in zip(completions, answer)]


def lenient_correctness(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the answer read as evaluation reads it ('####' answer, else the last number) is right.

    A shaping signal for models that cannot write the '####' line yet: it rewards right answers in any
    form, so groups have successes to compare before the format is learned."""
    return [1.0 if is_correct(completion_text(c), a, strict=False) else 0.0 for c, a in zip(completions, answer)]


def strict_format(prompts, completions, **kwargs) -> list[float]:
    """1.0 when the last non-empty line is exactly '#### <number>'."""
    return [1.0 if has_final_line(completion_text(c)) else 0.0 for c in completions]


def soft_format(prompts, completions, **kwargs) -> list[float]:
    """1.0 when a '#### <number>' appears anywhere."""
    return [1.0 if FINAL_MARK_RE.search(completion_text(c)) else 0.0 for c in completions]


def has_number(prompts, completions, **kwargs) -> list[float]:
    """1.0 when the completion contains any number at all (the weakest shaping signal)."""
    return [1.0 if extract_answer(completion_text(c), fallback=True)[0] is not None else 0.0 for c in completions]


def closeness(prompts, completions, answer, **kwargs) -> list[float]:
    """Partial credit in [0, 1] for a '####' answer near the gold one: 1 / (1 + |pred - gold| / max(1, |gold|))."""
    out = []
    for c, a in zip(completions, answer):
        pred = extract_final_answer(completion_text(c))
        try:
            p, g = float(pred), float(a)
        except (TypeError, ValueError):
            out.append(0.0)
            continue
        out.append(1.0 / (1.0 + abs(p - g) / max(1.0, abs(g))))
    return out


def brevity(prompts, completions, **kwargs) -> list[float]:
    """1.0 for completions up to 60 words, falling linearly to 0 at 200 words (discourages rambling)."""
    out = []
    for c in completions:
        n = len(completion_text(c).split())
        out.append(1.0 if n <= 60 else max(0.0, 1.0 - (n - 60) / 140))
    return out


def arithmetic(prompts, completions, question=None, difficulty=None, **kwargs) -> list[float]:
    """Credit for worked steps: right calculations 'a op b = c' built on the question's numbers, per step needed.

    A calculation counts when its result is right and one of its operands is a number of the question or
    the result of an earlier counted calculation (so '1 + 1 = 2' beside the problem earns nothing); each
    distinct one counts once, and each wrong calculation takes one away. The count is divided by the steps
    the problem needs (its difficulty: GSM8K's number of calculations; 1 if unknown) and kept in [0, 1].
    Without a question (the Try tab's free text) any operand counts. It does not read the final answer:
    weigh it with correctness, never alone (a page of right sums about the wrong thing would earn it)."""
    n = len(completions)
    questions = list(question) if question is not None else [None] * n
    steps = list(difficulty) if difficulty is not None else [1] * n
    out = []
    for c, q, d in zip(completions, questions, steps):
        known = question_numbers(q) if q is not None else None
        counted, wrong = set(), 0
        for calc in written_calculations(completion_text(c)):
            if not calc["right"]:
                wrong += 1
                continue
            key = (tuple(calc["operands"]), calc["result"])
            if key in counted or (known is not None and not known & set(calc["operands"])):
                continue
            counted.add(key)
            if known is not None:
                known.add(calc["result"])
        need = max(1, int(d or 1))
        out.append(min(1.0, max(0.0, (len(counted) - wrong) / need)))
    return out


REWARD_FUNCS: dict[str, Callable[..., list[float]]] = {
    "correctness": correctness,
    "lenient_correctness": lenient_correctness,
    "strict_format": strict_format,
    "soft_format": soft_format,
    "has_number": has_number,
    "closeness": closeness,
    "brevity": brevity,
    "arithmetic": arithmetic,
}


def reward_help() -> dict[str, str]:
    return {name: (fn.__doc__ or "").strip().splitlines()[0] for name, fn in REWARD_FUNCS.items()}


def build_rewards(weights: dict[str, float], funcs: dict[str, Callable] | None = None) -> tuple[list[Callable], list[float]]:
    """Functions and weights in a stable order (the order of `weights`), zero weights dropped. `funcs`: the
    registry to take them from (`custom_rewards.reward_functions(cfg.rewards)` for a config with rewards of
    its own), default the built-in rewards."""
    funcs = REWARD_FUNCS if funcs is None else funcs
    names = [n for n, w in weights.items() if float(w) != 0.0]
    return [funcs[n] for n in names], [float(weights[n]) for n in names]


def reward_columns(n: int, answer: str, question: str | None = None, difficulty: int | None = None) -> dict:
    """The dataset columns a training step passes to the reward functions, for n completions of one problem
    (a column left out when it is not known: older runs lack 'difficulty', Try may lack the question)."""
    columns = {"answer": [answer] * n}
    if question is not None:
        columns["question"] = [question] * n
    if difficulty is not None:
        columns["difficulty"] = [difficulty] * n
    return columns


def score_text(
    text: str, gold: str, weights: dict[str, float], question: str | None = None, difficulty: int | None = None,
    funcs: dict[str, Callable] | None = None,
) -> dict[str, float]:
    """Every weighted reward of one completion plus 'total' (for the Try tab and the GRPO-step view).
    `question` and `difficulty` are the columns a training step passes too (None: not known)."""
    scores = {}
    total = 0.0
    columns = reward_columns(1, gold, question, difficulty)
    for name, w in weights.items():
        v = (REWARD_FUNCS if funcs is None else funcs)[name]([""], [text], **columns)[0]
        scores[name] = v
        total += float(w) * v
    scores["total"] = total
    return scores
