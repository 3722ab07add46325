"""The one answer reader: rewards, the sampler's early stop and the evaluation all call it (nanochat's habit).

The final answer is the number after the last '####' (GSM8K's convention). Evaluation may fall back to
the last number in the text and says so (`extract_answer`'s `how`). `has_final_line` is the format
check: the last non-empty line is exactly '#### <number>'. Numbers from users (Try's expected answer,
uploaded answers) go through `normalize_number` too, whose bounds make it safe on untrusted text.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

FINAL_MARK_RE = re.compile(
    r"####\s*\$?\s*(-?\s*\$?\s*(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\s*\.\d+)(?:\s*/\s*(\d+))?"
)
FINAL_LINE_RE = re.compile(
    r"^\s*####\s*\$?\s*-?\s*\$?\s*(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:\s*/\s*\d+)?\s*\.?\s*$"
)
ANY_NUMBER_RE = re.compile(r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


# A number as people and models write it, once '$', ',' and spaces are gone: digits with an optional
# sign and decimal point; no exponent, no 'inf' or 'NaN'. Lengths are bounded, so a hostile value (a
# '1e999999999' or ten thousand digits) is refused at once instead of building a huge integer while the
# GIL is held (which stalls every other page of a shared server).
MAX_NUMBER_DIGITS = 40
_PLAIN_NUMBER_RE = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")  # ASCII digits only


def _plain_fraction(s: str) -> Fraction | None:
    if len(s) > MAX_NUMBER_DIGITS + 2 or not _PLAIN_NUMBER_RE.fullmatch(s):
        return None
    if sum(c.isdigit() for c in s) > MAX_NUMBER_DIGITS:
        return None
    return Fraction(Decimal(s))


def normalize_number(text: str | None) -> str | None:
    """'$1,200.50' -> '1200.5'; '-3.' -> '-3'; '3/4' -> '0.75'; junk, exponents, inf/NaN and numbers of
    more than MAX_NUMBER_DIGITS digits -> None."""
    if text is None:
        return None
    s = str(text)
    if len(s) > 4 * MAX_NUMBER_DIGITS:
        return None
    s = s.strip().replace(",", "").replace("$", "").replace(" ", "")
    s = s.rstrip(".")
    if not s:
        return None
    try:
        if "/" in s:
            num, den = (_plain_fraction(part) for part in s.split("/", 1))
            value = None if num is None or den is None else num / den
        else:
            value = _plain_fraction(s)
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None
    if value is None:
        return None
    if value.denominator == 1:
        return str(value.numerator)
    d = Decimal(value.numerator) / Decimal(value.denominator)
    return format(d.normalize(), "f")


def extract_final_answer(text: str) -> str | None:
    """The number after the last '####' (GSM8K's convention), normalized; None if there is none."""
    if not text:
        return None
    matches = list(FINAL_MARK_RE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    raw = m.group(1) + (f"/{m.group(2)}" if m.group(2) else "")
    return normalize_number(raw)


def extract_answer(text: str, fallback: bool = True) -> tuple[str | None, str]:
    """(answer, how) with how in {'marker', 'last_number', 'none'}.

    The '####' answer wins. With `fallback`, a text without one is read by its last number
    (the "flexible" reading many GSM8K harnesses report next to the strict one).
    """
    ans = extract_final_answer(text)
    if ans is not None:
        return ans, "marker"
    if fallback and text:
        nums = ANY_NUMBER_RE.findall(text)
        for raw in reversed(nums):
            v = normalize_number(raw)
            if v is not None:
                return v, "last_number"
    return None, "none"


def has_final_line(text: str) -> bool:
    """True when the last non-empty line is exactly a '#### <number>' line (the required format)."""
    lines = [ln for ln in (text or "").strip().split("\n") if ln.strip()]
    return bool(lines) and bool(FINAL_LINE_RE.match(lines[-1])) and extract_final_answer(lines[-1]) is not None


def answers_match(pred: str | None, gold: str | None) -> bool:
    if pred is None or gold is None:
        return False
    a, b = normalize_number(pred), normalize_number(gold)
    if a is None or b is None:
        return False
    if a == b:
        return True
    fa, fb = Fraction(Decimal(a)), Fraction(Decimal(b))
    return abs(fa - fb) <= Fraction(1, 10**6) * max(1, abs(fb))


# A written calculation: numbers joined by + - * / x × ÷, then '=' and a number ('3 * $4 = $12', '12x3=36',
# GSM8K's '<<3*4=12>>'). No parentheses: a '(...)' calculation is not read (it pays nothing, it is not wrong).
_CALC_NUM = r"\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_CALC_RE = re.compile(
    rf"(?<![\w.,$])({_CALC_NUM}(?:\s*[-+*/x×÷]\s*{_CALC_NUM}){{1,7}})\s*=\s*(-?{_CALC_NUM})(?![\d])"
)
_CALC_SPLIT_RE = re.compile(r"\s*([-+*/x×÷])\s*")
MAX_CALCULATIONS = 32  # read at most this many per text: a reward stays cheap on a 4,096-token ramble


def _calc_value(nums: list[str], ops: list[str]) -> Fraction | None:
    """Value of nums[0] ops[0] nums[1] ... with * and / before + and -, exactly (Fractions); None on a
    division by 0."""
    vals = [Fraction(Decimal(n)) for n in nums]
    ops = ["*" if o in "x×" else "/" if o == "÷" else o for o in ops]
    terms, signs = [vals[0]], []
    for op, v in zip(ops, vals[1:]):
        if op in "*/":
            if op == "/" and v == 0:
                return None
            terms[-1] = terms[-1] * v if op == "*" else terms[-1] / v
        else:
            signs.append(op)
            terms.append(v)
    total = terms[0]
    for op, v in zip(signs, terms[1:]):
        total = total + v if op == "+" else total - v
    return total


def written_calculations(text: str) -> list[dict]:
    """Every calculation 'a op b ... = c' written in `text`, in order (at most MAX_CALCULATIONS):
    its operands and result as normalized numbers, and whether the result is right (exact)."""
    out = []
    for m in _CALC_RE.finditer(text or ""):
        if len(out) >= MAX_CALCULATIONS:
            break
        parts = _CALC_SPLIT_RE.split(m.group(1).strip())
        operands = [normalize_number(p) for p in parts[0::2]]
        result = normalize_number(m.group(2))
        if result is None:
            continue
        value = None if None in operands else _calc_value(operands, parts[1::2])  # unreadable: not right
        out.append({
            "text": m.group(0),
            "operands": operands,
            "result": result,
            "right": value is not None and value == Fraction(Decimal(result)),
        })
    return out


def question_numbers(question: str) -> set[str]:
    """The numbers a question states, normalized ('$1,200' -> '1200')."""
    found = (normalize_number(m.group(0)) for m in ANY_NUMBER_RE.finditer(question or ""))
    return {n for n in found if n is not None}
