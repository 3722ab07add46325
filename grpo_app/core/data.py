"""Problems and where they come from (answers are read by answers.py, prompts built by prompts.py).

Difficulty is the number of calculation steps of a problem's worked solution (GSM8K: its
'<<a*b=c>>' calculator annotations; arithmetic: its operators; gsm_symbolic: lines with '='; word: its steps, 1 or 2).

Sources: GSM8K from a local folder (config or GRPO_APP_GSM8K_DIR), from the hub when it is
reachable, and otherwise tasks generated offline by the `reasoning-gym` package.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import random
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path

from grpo_app.core.answers import extract_final_answer, normalize_number
from grpo_app.core.config import ConfigError, problem_ids_path, read_problem_ids
from grpo_app.core.prompts import build_messages


# ------------------------------------------------------------------------------------------------
# Problems
# ------------------------------------------------------------------------------------------------
@dataclass
class Problem:
    id: str
    question: str
    answer: str  # normalized final answer
    solution: str  # worked solution ending in '#### <answer>' (used for reference Fisher / display)
    difficulty: int
    source: str

    def to_dict(self) -> dict:
        return asdict(self)


class DataError(ValueError):
    """A data source is unavailable or a file is invalid; the message says what to do."""


def gsm8k_difficulty(solution: str) -> int:
    return solution.count("<<")


def gsm8k_problem(rec: dict, idx: int, split: str) -> Problem:
    sol = rec["answer"]
    gold = extract_final_answer(sol)
    if gold is None:
        raise DataError(f"GSM8K {split} row {idx + 1} has no '#### <number>' line.")
    return Problem(
        id=f"gsm8k-{split}-{idx}",
        question=rec["question"].strip(),
        answer=gold,
        solution=sol.strip(),
        difficulty=gsm8k_difficulty(sol),
        source="gsm8k",
    )


# ---- GSM8K from a folder or the hub --------------------------------------------------------------
_HUB_STATE: dict = {"checked": 0.0, "ok": False}
_HUB_LOCK = threading.Lock()


def hub_reachable(timeout: float = 2.0) -> bool:
    """Can huggingface.co be reached? Honors HF_HUB_OFFLINE; cached for a minute; never hangs long."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        _enter_offline_mode()
        return False
    with _HUB_LOCK:
        if time.time() - _HUB_STATE["checked"] < 60:
            return _HUB_STATE["ok"]
        ok = False
        try:
            with socket.create_connection(("huggingface.co", 443), timeout=timeout):
                ok = True
        except OSError:
            ok = False
        _HUB_STATE.update(checked=time.time(), ok=ok)
        if not ok:
            _enter_offline_mode()
        return ok


def _enter_offline_mode() -> None:
    """Tell huggingface_hub (and so transformers/datasets) not to retry the network for ~25 s per file."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import huggingface_hub.constants as hf_constants

        hf_constants.HF_HUB_OFFLINE = True
    except Exception:  # pragma: no cover
        pass


def gsm8k_dir(data_cfg) -> Path | None:
    folder = (getattr(data_cfg, "gsm8k_dir", "") or os.environ.get("GRPO_APP_GSM8K_DIR", "")).strip()
    return Path(folder).expanduser() if folder else None


def gsm8k_dir_label(data_cfg) -> str:
    """The local GSM8K folder as a user knows it (by the setting that names it), never its server path: the
    run log and the errors of a shared server are read by every page (issue 45)."""
    set_by = "data.gsm8k_dir" if (getattr(data_cfg, "gsm8k_dir", "") or "").strip() else "GRPO_APP_GSM8K_DIR"
    return f"local GSM8K folder ({set_by})"


_GSM8K_CACHE: dict = {}


def load_gsm8k(split: str, data_cfg) -> tuple[list[Problem], str]:
    """GSM8K `split` ('train' or 'test') and where it came from. Raises DataError when unavailable."""
    if split not in ("train", "test"):
        raise DataError(f"GSM8K split must be train or test, not {split!r}.")
    mode = getattr(data_cfg, "gsm8k", "auto")
    if mode == "offline":
        raise DataError("GSM8K is switched off (data.gsm8k: offline).")
    folder = gsm8k_dir(data_cfg)
    if folder is not None and mode in ("auto", "local"):
        path = folder / f"{split}.jsonl"
        if path.is_file():
            key = ("local", str(path.resolve()), path.stat().st_mtime)
            if key not in _GSM8K_CACHE:
                probs = []
                with path.open(encoding="utf-8") as fh:
                    for i, line in enumerate(fh):
                        if line.strip():
                            probs.append(gsm8k_problem(json.loads(line), i, split))
                _GSM8K_CACHE[key] = probs
            return _GSM8K_CACHE[key], gsm8k_dir_label(data_cfg)
        if mode == "local":
            raise DataError(
                f"the {gsm8k_dir_label(data_cfg)} has no {split}.jsonl; point it at the folder holding {split}.jsonl."
            )
    if mode == "local":
        raise DataError("data.gsm8k is 'local' but no folder is set (data.gsm8k_dir or GRPO_APP_GSM8K_DIR).")
    hub_id = getattr(data_cfg, "hub_dataset", "openai/gsm8k")
    if not hub_reachable():
        raise DataError(
            f"GSM8K: no local folder set and the hub ({hub_id}) is not reachable; "
            "set GRPO_APP_GSM8K_DIR to a folder with train.jsonl/test.jsonl."
        )
    key = ("hub", hub_id, split)
    if key not in _GSM8K_CACHE:
        from datasets import load_dataset

        try:
            ds = load_dataset(hub_id, "main", split=split)
        except Exception as e:  # network hiccup, gated repo, ...
            raise DataError(f"GSM8K could not be loaded from the hub ({hub_id}): {str(e).splitlines()[0]}") from None
        _GSM8K_CACHE[key] = [gsm8k_problem(r, i, split) for i, r in enumerate(ds)]
    return _GSM8K_CACHE[key], f"hub {hub_id}"


# ---- Offline generated tasks (reasoning-gym) ---------------------------------------------------
def _rg():
    import reasoning_gym

    return reasoning_gym


def make_arithmetic(
    n: int,
    seed: int,
    min_ops: int = 1,
    max_ops: int = 1,
    max_digits: int = 2,
    operators: str = "+-",
    negation: bool = False,
) -> list[Problem]:
    """reasoning-gym `basic_arithmetic`: difficulty = number of operators (terms - 1)."""
    ds = _rg().create_dataset(
        "basic_arithmetic",
        size=n,
        seed=seed,
        min_terms=min_ops + 1,
        max_terms=max_ops + 1,
        min_digits=1,
        max_digits=max_digits,
        operators=tuple(operators),
        allow_negation=negation,
        allow_parentheses=negation,
    )
    out = []
    for i, x in enumerate(ds):
        gold = normalize_number(x["answer"])
        expr = x["metadata"]["expression"]
        out.append(
            Problem(
                id=f"arith-{seed}-{i}",
                question=x["question"].strip(),
                answer=gold,
                solution=f"{expr} = {gold}\n#### {gold}",
                difficulty=int(x["metadata"]["num_terms"]) - 1,
                source="arithmetic",
            )
        )
    return out


# reasoning-gym's gsm_symbolic generators are templates of GSM8K *test* questions (GSM-Symbolic was built
# from GSM8K's test split): each template keeps a test question's story and changes its names and numbers.
# Measured with bench/symbolic_overlap.py (assets/symbolic_overlap.json): 84 of the 85 templates the
# package uses share at least half their words (Jaccard) with one GSM8K test question, 7 with a train one.
# So a model trained on gsm_symbolic has seen GSM8K test questions in another dress: its GSM8K test
# score is not a held-out score, and held-out gsm_symbolic problems are new numbers on the same templates.
GSM_SYMBOLIC_LEAK = (
    "reasoning-gym gsm_symbolic problems are templates of GSM8K test questions (new names and numbers, the "
    "same stories), so this score is not held out"
)


def gsm_symbolic_difficulty(cot: str) -> int:
    return max(1, sum(1 for ln in cot.split("\n") if "=" in ln))


def make_gsm_symbolic(n: int, seed: int) -> list[Problem]:
    ds = _rg().create_dataset("gsm_symbolic", size=n, seed=seed)
    out = []
    for i, x in enumerate(ds):
        cot = x["metadata"]["answer_cot"].strip()
        gold = normalize_number(x["answer"])
        out.append(
            Problem(
                id=f"gsmsym-{seed}-{i}",
                question=x["question"].strip(),
                answer=gold,
                solution=cot if "####" in cot else f"{cot}\n#### {gold}",
                difficulty=gsm_symbolic_difficulty(cot),
                source="gsm_symbolic",
            )
        )
    return out


# ---- Word problems (generated here, offline) ------------------------------------------------------
# A story around one addition or one subtraction, e.g. "Mia has 34 stickers. She gets 27 more. How many
# stickers does Mia have now?": the step from arithmetic to GSM8K that the model can take at 135M (GSM8K's
# easiest problems need two or more steps, and gsm_symbolic's stories are GSM8K test questions). The answer is
# never negative (a subtraction takes the smaller number from the larger). Difficulty 1 (one step); two steps below.
_WORD_NAMES = ("Mia", "Leo", "Ava", "Sam", "Zoe", "Ben", "Ivy", "Max", "Lily", "Omar", "Nora", "Theo",
               "Ella", "Ravi", "Lucy", "Jack", "Emma", "Finn", "Rosa", "Kai")
_WORD_ITEMS = ("apples", "stickers", "marbles", "books", "pencils", "cookies", "shells", "cards", "stamps",
               "balloons", "coins", "beads", "flowers", "crayons", "toy cars", "eggs")
_WORD_ADD = (
    "{n} has {a} {x}. {p} gets {b} more. How many {x} does {n} have now?",
    "{n} picked {a} {x} in the morning and {b} {x} in the afternoon. How many {x} did {n} pick in all?",
    "There are {a} {x} in a box and {b} {x} in a bag. How many {x} are there altogether?",
    "{n} bought {a} {x} on Monday and {b} {x} on Tuesday. How many {x} did {n} buy?",
    "{n} has {a} {x} and {m} has {b} {x}. How many {x} do they have together?",
    "A shop sold {a} {x} before lunch and {b} {x} after lunch. How many {x} did it sell that day?",
)
_WORD_SUB = (
    "{n} has {a} {x}. {p} gives {b} of them away. How many {x} does {n} have left?",
    "There were {a} {x} on the table. {n} took {b} of them. How many {x} are still on the table?",
    "{n} has {a} {x} and {m} has {b} {x}. How many more {x} does {n} have than {m}?",
    "A shop had {a} {x}. It sold {b} of them. How many {x} does the shop have now?",
    "{n} needs {a} {x} and already has {b}. How many more {x} does {n} need?",
    "{n} had {a} {x} and lost {b} of them. How many {x} does {n} have now?",
)
# Equal groups (operators '*' and '/'): one multiplication, or a division that comes out whole; factors of 2 to
# `max_digits` digits (quotients too), so one digit gives the times tables as stories.
_WORD_MUL = (
    "{n} has {a} bags with {b} {x} in each bag. How many {x} does {n} have?",
    "There are {a} boxes and each box holds {b} {x}. How many {x} are there in all?",
    "{n} buys {a} packs of {x}. Each pack has {b} {x}. How many {x} does {n} buy?",
    "{n} puts {x} in {a} rows with {b} {x} in each row. How many {x} are there?",
)
_WORD_DIV = (  # {a} = {b} * the answer
    "{n} shares {a} {x} equally among {b} friends. How many {x} does each friend get?",
    "{n} packs {a} {x} into {b} boxes with the same number in each box. How many {x} are in each box?",
    "{n} puts {a} {x} into bags of {b}. How many bags does {n} fill?",
    "{a} {x} are shared equally by {b} children. How many {x} does each child get?",
)
_PRONOUN = {name: ("She" if name in {"Mia", "Ava", "Zoe", "Ivy", "Lily", "Nora", "Ella", "Lucy", "Emma", "Rosa"}
                   else "He") for name in _WORD_NAMES}


# Two steps (difficulty 2): the same stories with a second event, e.g. "Mia has 7 stickers. She gets 5 more,
# then gives 3 away. How many stickers does Mia have now?" (GSM8K's problems take two or more steps). Keyed by
# the two operations; every result, between and at the end, is at least 1.
_WORD_TWO = {
    "++": (
        "{n} has {a} {x}. {p} gets {b} more on Monday and {c} more on Tuesday. How many {x} does {n} have now?",
        "There are {a} {x} in a box, {b} {x} in a bag and {c} {x} on the table. How many {x} are there altogether?",
        "{n} picked {a} {x}, {m} picked {b} {x} and their friend picked {c} {x}. How many {x} did they pick in all?",
    ),
    "+-": (
        "{n} has {a} {x}. {p} gets {b} more, then gives {c} of them away. How many {x} does {n} have now?",
        "{n} bought {a} {x} on Monday and {b} {x} on Tuesday, then lost {c} of them. How many {x} does {n} have left?",
        "There were {a} {x} in a box. {n} put in {b} more, then {m} took {c} out. How many {x} are in the box now?",
    ),
    "-+": (
        "{n} had {a} {x} and gave {b} of them to {m}. {p} then bought {c} more. How many {x} does {n} have now?",
        "A shop had {a} {x}. It sold {b} of them and then got {c} more. How many {x} does the shop have now?",
        "There were {a} {x} on the table. {n} took {b} of them and {m} put {c} more on it. How many {x} are on the table now?",
    ),
    "--": (
        "{n} has {a} {x}. {p} gives {b} to {m} and {c} to a friend. How many {x} does {n} have left?",
        "A shop had {a} {x}. It sold {b} in the morning and {c} in the afternoon. How many {x} are left?",
        "There were {a} {x} in a bag. {n} took {b} and {m} took {c}. How many {x} are still in the bag?",
    ),
}


def _two_step(rng: random.Random, ops: list[str], hi: int) -> tuple[str, tuple[int, int, int], int, str]:
    """(operations, (a, b, c), answer, worked solution) of a two-step story whose every result is >= 1."""
    kind = rng.choice([o1 + o2 for o1 in ops for o2 in ops])
    while True:
        a, b, c = rng.randint(2, hi), rng.randint(1, hi), rng.randint(1, hi)
        mid = a + b if kind[0] == "+" else a - b
        end = mid + c if kind[1] == "+" else mid - c
        if mid >= 1 and end >= 1:
            break
    return kind, (a, b, c), end, f"{a} {kind[0]} {b} = {mid}\n{mid} {kind[1]} {c} = {end}\n#### {end}"


def make_word_problems(
    n: int, seed: int, max_digits: int = 2, operators: str = "+-", min_steps: int = 1, max_steps: int = 1,
    even_differences: bool = False,
) -> list[Problem]:
    """`n` word problems of `min_steps` to `max_steps` steps (1 or 2; the difficulty) with `operators` (from '+-*/';
    two steps add and subtract), numbers of 1 to `max_digits` digits. A one-step '+-' set is the same as before
    two steps and equal groups existed.

    One-step take-away stories draw both numbers and put the larger first (equal ones: the first gets 1 more), so
    small differences are common: with one digit a third of the answers are 1. `even_differences` draws the
    difference d (1 to the largest number - 1) and then the smaller number b (1 to largest - d) instead, so each
    answer is equally common (1 in 8 with one digit); the other problems of a mixed set are drawn as before."""
    ops = [o for o in "+-*/" if o in operators] or ["+", "-"]
    hi = 10 ** max_digits - 1
    out = []
    for i in range(n):
        rng = random.Random(f"word-{seed}-{i}")  # item i depends on (seed, i) only, like basic_arithmetic's
        steps = 1 if max_steps <= 1 else rng.randint(max(1, min_steps), 2)
        if steps == 2:
            kind, (a, b, c), end, solution = _two_step(rng, [o for o in ops if o in "+-"] or ["+", "-"], hi)
            name, other = rng.sample(_WORD_NAMES, 2)
            question = rng.choice(_WORD_TWO[kind]).format(
                n=name, m=other, p=_PRONOUN[name], a=a, b=b, c=c, x=rng.choice(_WORD_ITEMS))
            out.append(Problem(id=f"word-{seed}-{i}", question=question, answer=str(end), solution=solution,
                               difficulty=2, source="word"))
            continue
        op = rng.choice(ops)
        if op in "*/":  # '*': {a} groups of {b}; '/': {a} = {b} * the answer, shared by {b}
            b, c = rng.randint(2, hi), rng.randint(2, hi)
            a, gold = (c, c * b) if op == "*" else (b * c, c)
            name, other = rng.sample(_WORD_NAMES, 2)
            template = rng.choice(_WORD_MUL if op == "*" else _WORD_DIV)
            question = template.format(n=name, m=other, a=a, b=b, x=rng.choice(_WORD_ITEMS))
            out.append(Problem(id=f"word-{seed}-{i}", question=question, answer=str(gold),
                               solution=f"{a} {op} {b} = {gold}\n#### {gold}", difficulty=1, source="word"))
            continue
        if op == "-" and even_differences:
            d = rng.randint(1, hi - 1)
            b = rng.randint(1, hi - d)
            a = b + d
        else:
            a, b = rng.randint(2, hi), rng.randint(1, hi)
            if op == "-":
                if a == b:
                    a += 1
                a, b = max(a, b), min(a, b)
        name, other = rng.sample(_WORD_NAMES, 2)
        template = rng.choice(_WORD_ADD if op == "+" else _WORD_SUB)
        question = template.format(n=name, m=other, p=_PRONOUN[name], a=a, b=b, x=rng.choice(_WORD_ITEMS))
        gold = str(a + b if op == "+" else a - b)
        out.append(Problem(id=f"word-{seed}-{i}", question=question, answer=gold,
                           solution=f"{a} {op} {b} = {gold}\n#### {gold}", difficulty=1, source="word"))
    return out


# ---- Custom uploads ------------------------------------------------------------------------------
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
MAX_UPLOAD_ROWS = 50_000
MAX_QUESTION_CHARS = 4000


def parse_custom_dataset(raw: bytes, filename: str) -> list[Problem]:
    """JSONL or CSV with 'question' and 'answer' columns. Answer: a number, or a solution ending '#### n'.

    Raises DataError listing the bad rows (at most 20 shown) so a person can fix the file.
    """
    if len(raw) > MAX_UPLOAD_BYTES:
        raise DataError(f"{filename}: {len(raw) / 1e6:.1f} MB is over the {MAX_UPLOAD_BYTES // 2**20} MB limit.")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{filename}: not UTF-8 text (byte {e.start}); save the file as UTF-8.") from None
    suffix = Path(filename).suffix.lower()
    rows: list[tuple[int, dict]] = []
    problems_found: list[str] = []
    if suffix in (".jsonl", ".json"):
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:  # JSONDecodeError, an integer over 4300 digits, deep nesting
                why = getattr(e, "msg", "nested too deeply" if isinstance(e, RecursionError) else "a number too long")
                problems_found.append(f"line {i}: not valid JSON ({why})")
                continue
            if not isinstance(obj, dict):
                problems_found.append(f"line {i}: expected an object with question and answer")
                continue
            rows.append((i, obj))
    elif suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames or not {"question", "answer"} <= {f.strip().lower() for f in reader.fieldnames}:
            raise DataError(f"{filename}: the CSV header must include 'question' and 'answer' columns.")
        try:
            for i, rec in enumerate(reader, 2):
                rows.append((i, {k.strip().lower(): v for k, v in rec.items() if k}))
        except csv.Error as e:  # a field over csv's size limit, a NUL byte, ...
            raise DataError(f"{filename}: row {reader.line_num}: not readable as CSV ({e}).") from None
    else:
        raise DataError(f"{filename}: use a .jsonl or .csv file.")
    if len(rows) > MAX_UPLOAD_ROWS:
        raise DataError(f"{filename}: {len(rows)} rows is over the {MAX_UPLOAD_ROWS} row limit.")
    out = []
    for i, rec in rows:
        q = rec.get("question")
        a = rec.get("answer")
        where = f"line {i}" if suffix != ".csv" else f"row {i}"
        if not isinstance(q, str) or not q.strip():
            problems_found.append(f"{where}: missing 'question'")
            continue
        if len(q) > MAX_QUESTION_CHARS:
            problems_found.append(f"{where}: question longer than {MAX_QUESTION_CHARS} characters")
            continue
        if a is None or (isinstance(a, str) and not a.strip()):
            problems_found.append(f"{where}: missing 'answer'")
            continue
        a_text = _answer_text(a)
        gold = normalize_number(_final_line(a_text) if "####" in a_text else a_text)
        if gold is None:
            problems_found.append(f"{where}: answer {a_text[:40]!r} is not a number (or a solution ending '#### n')")
            continue
        sol = a_text.strip() if "####" in a_text else f"#### {gold}"
        out.append(
            Problem(
                id=f"custom-{i}",
                question=q.strip(),
                answer=gold,
                solution=sol,
                difficulty=gsm8k_difficulty(sol) if "<<" in sol else max(1, sol.count("\n")),
                source="custom",
            )
        )
    if problems_found:
        shown = "; ".join(problems_found[:20])
        more = f" (and {len(problems_found) - 20} more)" if len(problems_found) > 20 else ""
        raise DataError(f"{filename}: {len(problems_found)} bad rows: {shown}{more}.")
    if not out:
        raise DataError(f"{filename}: no rows found.")
    return out


def _answer_text(a) -> str:
    """An uploaded answer as text; a JSON number keeps its value (1e20 -> '100000000000000000000')."""
    if isinstance(a, float) and math.isfinite(a):
        return format(Decimal(repr(a)), "f") if abs(a) < 1e40 else repr(a)
    return str(a)


def _final_line(solution: str) -> str:
    """What follows the last '####' on its line: the whole of it must be the number ('#### 1e9' is not 1)."""
    return solution.rsplit("####", 1)[1].split("\n", 1)[0]


def load_custom(path: str) -> list[Problem]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"custom dataset {path} does not exist.")
    return parse_custom_dataset(p.read_bytes(), p.name)


# ------------------------------------------------------------------------------------------------
# Stages and held-out sets
# ------------------------------------------------------------------------------------------------
@dataclass
class StagePool:
    problems: list[Problem]
    origin: str  # human-readable: where the problems came from
    source: str  # the source actually used (may differ from the stage's when GSM8K is offline)


def _filter_difficulty(probs: list[Problem], lo: int, hi: int) -> list[Problem]:
    return [p for p in probs if lo <= p.difficulty <= hi]


def _sample(probs: list[Problem], n: int, seed: int) -> list[Problem]:
    if len(probs) <= n:
        return list(probs)
    return random.Random(seed).sample(probs, n)


def _listed_pool(stage, probs: list[Problem], origin: str, n: int, seed: int) -> StagePool:
    """The GSM8K train problems a stage's `problem_ids` file names (at most `n` of them, drawn with `seed`).
    Every id must be in this copy of the train split: a list made on openai/gsm8k's row order means
    nothing on another file, so a mismatch is an error, not a silent smaller pool."""
    try:
        ids = read_problem_ids(stage.problem_ids)
    except ConfigError as e:
        raise DataError(f"stage '{stage.name}': {e.errors[0][1]}") from None
    by_id = {p.id: p for p in probs}
    missing = [i for i in ids if i not in by_id]
    name = problem_ids_path(stage.problem_ids).name
    if missing:
        raise DataError(
            f"stage '{stage.name}': {len(missing)} of the {len(ids)} problems in {name} are not in GSM8K train "
            f"({origin}), e.g. {missing[0]}; the list counts rows of openai/gsm8k's train split from 0."
        )
    sel = _sample([by_id[i] for i in ids], n, seed)
    return StagePool(sel, f"GSM8K train ({origin}), {len(sel)} of the {len(ids)} problems listed in {name}", "gsm8k")


def stage_pool(stage, data_cfg, seed: int, split: str = "train") -> StagePool:
    """The problems a stage trains on (split='train') or is evaluated on (split='test', see heldout_pool)."""
    lo, hi, n = stage.min_difficulty, stage.max_difficulty, stage.num_problems
    source = stage.source
    note = ""
    if source == "gsm8k":
        try:
            probs, origin = load_gsm8k(split, data_cfg)
        except DataError as e:
            source, note = "gsm_symbolic", f"GSM8K unavailable ({e}); using reasoning-gym gsm_symbolic instead"
        else:
            listed = getattr(stage, "problem_ids", "")
            if listed and split == "train":
                return _listed_pool(stage, probs, origin, n, seed)
            sel = _filter_difficulty(probs, lo, hi)
            if len(sel) < min(n, 8):
                raise DataError(
                    f"stage '{stage.name}': only {len(sel)} GSM8K {split} problems have difficulty {lo}..{hi}; widen the range."
                )
            return StagePool(_sample(sel, n, seed), f"GSM8K {split} ({origin}), difficulty {lo}-{hi}", "gsm8k")
    if source == "arithmetic":
        lo_ops, hi_ops = max(1, lo), max(1, hi)
        probs = make_arithmetic(n, seed, lo_ops, hi_ops, stage.max_digits, stage.operators, stage.negation)
        return StagePool(
            probs,
            f"reasoning-gym basic_arithmetic, {lo_ops}-{hi_ops} operators '{stage.operators}', <= {stage.max_digits} digits"
            + (", negation" if stage.negation else ""),
            "arithmetic",
        )
    if source == "word":
        probs = make_word_problems(n, seed, stage.max_digits, stage.operators, lo, hi, stage.even_differences)
        steps = "one-step" if hi <= 1 else ("two-step" if lo >= 2 else "one- and two-step")
        even = ", even differences" if stage.even_differences else ""
        return StagePool(probs, f"{steps} word problems ('{stage.operators}', <= {stage.max_digits} digits{even})", "word")
    if source == "gsm_symbolic":
        probs = _filter_difficulty(make_gsm_symbolic(max(4 * n, 64), seed), lo, hi)
        if len(probs) < min(n, 8):
            raise DataError(
                f"stage '{stage.name}': gsm_symbolic has almost no problems with difficulty {lo}..{hi}; use 2..5."
            )
        origin = f"reasoning-gym gsm_symbolic, difficulty {lo}-{hi}"
        return StagePool(probs[:n], f"{origin} ({note})" if note else origin, "gsm_symbolic")
    if source == "custom":
        probs = _filter_difficulty(load_custom(data_cfg.custom_path), lo, hi) or load_custom(data_cfg.custom_path)
        return StagePool(_sample(probs, n, seed), f"custom file {Path(data_cfg.custom_path).name}", "custom")
    raise DataError(f"unknown source {source!r}")


_EXPR = re.compile(r"(?<![\w)])-?[(\d][\d\s+\-*/().]*[\d)]")
_TOKENS = re.compile(r"\d+(?:\.\d+)?|[+\-*/()]")


def _canonical_expression(expr: str) -> str | None:
    """The same sum or product whatever the order of its terms: '94 - 83 + 8' and '8 + 94 - 83' give one key;
    None for an expression with parentheses, a division, or a mix of +/- and * (left as written)."""
    toks = _TOKENS.findall(expr)
    if "(" in toks or "/" in toks:
        return None
    terms, sign, want_operand, binary = [], 1, True, set()
    for t in toks:
        if t in "+-*":
            if want_operand:  # a unary sign
                if t == "*":
                    return None
                sign = -sign if t == "-" else sign
            else:
                binary.add(t)
                sign = -1 if t == "-" else 1
                want_operand = True
        else:
            terms.append(("-" if sign < 0 else "") + t)
            sign, want_operand = 1, False
    if len(terms) < 2 or not binary or ("*" in binary and binary != {"*"}):
        return None
    kind = "product" if binary == {"*"} else "sum"
    return f"{kind}({','.join(sorted(terms))})"


def question_key(question: str) -> str:
    """A question as held-out checks compare it: whitespace folded, and an arithmetic expression in it (the
    longest one) put in a canonical order, so 'Calculate 12 + 7.' and 'Calculate 7 + 12.' are one problem
    (a commuted duplicate counts as seen in training)."""
    text = " ".join(str(question).split())
    best = max(_EXPR.finditer(text), key=lambda m: len(m.group()), default=None)
    if best is not None:
        canon = _canonical_expression(best.group())
        if canon is not None:
            return text[: best.start()] + canon + text[best.end():]
    return text


def with_replay(stages, k: int, data_cfg, seed: int, own: list[Problem]) -> list[Problem]:
    """Stage k's training problems with `stages[k].replay` of them replaced by problems drawn (with `seed`) from
    the earlier stages' pools, drawn as those stages drew them. Replay is the standard continual-learning
    baseline beside EWC (issue 42).

    The list is in training order (the trainer does not shuffle a replay stage again, `settings.grpo_args`):
    the stage's own problems shuffled with `seed`, the replayed ones spread evenly among them, so that every
    stretch of prompts holds the share, each step's and the first `steps x prompts_per_step` a short stage trains
    on. (Shuffled together instead, an 8-step stage of 32 prompts from a pool of 512 at a share of 0.3 trained on
    2 to 11 replayed problems, not about 10: docs/experiments.md.)"""
    share = float(getattr(stages[k], "replay", 0.0) or 0.0)
    if share <= 0 or k == 0 or not own:
        return list(own)
    earlier = [p for j in range(k) for p in stage_pool(stages[j], data_cfg, seed=data_cfg.seed + j).problems]
    n, n_replay = len(own), min(len(earlier), round(share * len(own)))
    rng = random.Random(seed)
    kept = own[: n - n_replay]
    rng.shuffle(kept)
    replayed, kept = iter(rng.sample(earlier, n_replay)), iter(kept)
    # Position i holds a replayed problem where the running count floor(i * n_replay / n) steps up: exactly
    # n_replay positions, evenly spaced (any m consecutive prompts hold m * share of them, rounded up or down).
    return [next(replayed) if (i + 1) * n_replay // n > i * n_replay // n else next(kept) for i in range(n)]


HELDOUT_SEED_OFFSET = 1_000_003  # reasoning-gym derives item i from seed + i: keep far from training seeds


def heldout_pool(stage, data_cfg, n: int, seed: int, exclude_questions: set[str] | None = None) -> StagePool:
    """`n` problems like the stage's, never in its training pool.

    GSM8K: the test split. Generated tasks: a seed far from any training seed, then any question
    that also appears in `exclude_questions` (the training pool), as written or with its terms in another order
    (`question_key`), is dropped, and so is a repeat within the set.
    """
    exclude = {question_key(q) for q in exclude_questions or ()}
    if stage.source == "gsm8k":
        try:
            probs, origin = load_gsm8k("test", data_cfg)
            sel = _sample(_filter_difficulty(probs, stage.min_difficulty, stage.max_difficulty), n, seed)
            return StagePool(
                sel, f"GSM8K test ({origin}), difficulty {stage.min_difficulty}-{stage.max_difficulty}", "gsm8k"
            )
        except DataError:
            pass
    from copy import copy

    st = copy(stage)
    if st.source == "gsm8k":
        st.source = "gsm_symbolic"
    st.num_problems = n * 4 + 32  # (item i depends on seed + i only: more candidates keep the same first ones)
    pool = stage_pool(st, data_cfg, seed + HELDOUT_SEED_OFFSET)
    seen, kept = set(), []
    for p in pool.problems:
        key = question_key(p.question)
        if key in exclude or key in seen:
            continue
        seen.add(key)
        kept.append(p)
    origin = f"held-out {pool.origin}"
    if pool.source == "gsm_symbolic":  # (new questions; the stories are the same templates a stage trains on)
        origin += ": new names and numbers on the same templates as the training problems"
    return StagePool(kept[:n], origin, pool.source)


def to_rows(problems: list[Problem], system_prompt: str, after_question: str = "") -> list[dict]:
    """Rows for TRL: 'prompt' (chat messages) plus the columns reward functions receive."""
    return [
        {
            "prompt": build_messages(p.question, system_prompt, after_question),
            "answer": p.answer,
            "difficulty": p.difficulty,
            "question": p.question,
            "problem_id": p.id,
        }
        for p in problems
    ]
