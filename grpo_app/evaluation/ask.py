"""Ask two models the same question and stream both answers (the Try tab's engine; no Gradio import).

Both models decode greedily with the project's sampler (`generation.generate_completions`), each
in its own thread, and `stream_answers` yields the text so far every `interval` seconds. The final
answer is read and scored by the same code as training and evaluation (`evaluation.score_output`,
`rewards.score_text`). Loaded models are kept in a small LRU cache so a second question is fast.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator

from grpo_app.core.answers import normalize_number
from grpo_app.core.data import MAX_QUESTION_CHARS
from grpo_app.core.models import model_bytes
from grpo_app.core.prompts import prompt_ids
from grpo_app.core.rewards import score_text
from grpo_app.evaluation.scoring import load_for_eval, score_output
from grpo_app.training.sampler import SamplingParams, generate_completions

MAX_TRY_CHARS = 2000  # a question longer than this is almost certainly a paste error
MAX_TRY_TOKENS = 512


class ModelCache:
    """Loaded (model, tokenizer, spec) by model name, least recently used evicted beyond `capacity`."""

    def __init__(self, capacity: int = 2):
        self.capacity = capacity
        self._models: collections.OrderedDict[str, tuple] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, name: str, fingerprint: str = ""):
        key = f"{name}|{fingerprint}"
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            # restrict_paths=False: callers pass names they have already checked (runs, resolve_model)
            entry = load_for_eval(name, int8=False, restrict_paths=False)
            self._models[key] = entry
            while len(self._models) > self.capacity:
                self._models.popitem(last=False)
            return entry

    def clear(self) -> None:
        with self._lock:
            self._models.clear()

    def loaded(self) -> list[dict]:
        with self._lock:
            return [
                {"name": k.split("|")[0], "label": v[2].label, "bytes": model_bytes(v[0])}
                for k, v in self._models.items()
            ]


def check_question(question: str | None) -> str | None:
    """A message saying what is wrong with a typed question, or None if it can be asked."""
    q = (question or "").strip()
    if not q:
        return "Type a question, or pick a problem from the list."
    if len(q) > MAX_TRY_CHARS:
        return f"The question is {len(q):,} characters long; keep it under {MAX_TRY_CHARS:,} (GSM8K problems are ~250)."
    if len(q) > MAX_QUESTION_CHARS:  # pragma: no cover - MAX_TRY_CHARS is lower
        return "The question is too long."
    return None


def check_gold(gold: str | None) -> str | None:
    g = (gold or "").strip()
    if g and normalize_number(g) is None:
        return f"'{g[:30]}' is not a number; leave it empty or type the expected answer, e.g. 42."
    return None


ANSWER_REWARDS = ("correctness", "lenient_correctness", "closeness")  # need the expected answer


def finish(text: str, gold: str | None, weights: dict[str, float], question: str | None = None, funcs=None) -> dict:
    """Extracted answer, correctness (when a gold answer is known) and every reward's score.

    Without a gold answer the rewards that compare with it are left out (they would all read 0),
    and `partial` says so."""
    gold = (gold or "").strip()
    norm_gold = normalize_number(gold) if gold else None
    scored = score_output(text, norm_gold or "")
    partial = norm_gold is None and any(k in ANSWER_REWARDS for k in weights or {})
    if norm_gold is None:
        weights = {k: w for k, w in (weights or {}).items() if k not in ANSWER_REWARDS}
    return {
        "pred": scored["pred"],
        "how": scored["how"],
        "has_format": scored["has_format"],
        "correct": scored["correct"] if norm_gold is not None else None,
        "rewards": score_text(text, norm_gold or "", weights, question=question, funcs=funcs) if weights else {},
        "partial": partial,
        "gold": norm_gold,
    }


def stream_answers(
    models: dict[str, tuple],
    question: str,
    system_prompt: str,
    max_new_tokens: int = 256,
    should_stop: Callable[[], bool] | None = None,
    interval: float = 0.25,
) -> Iterator[dict[str, dict]]:
    """Generate greedily with every (role -> (model, tokenizer, spec)) at once; yield partial texts.

    Yields {role: {text, tokens, done, stop, seconds}} until every model has finished; the last
    yield has done=True for all roles. `should_stop()` ends every generation at its next token.
    """
    max_new_tokens = max(1, min(int(max_new_tokens), MAX_TRY_TOKENS))
    state = {
        role: {"text": "", "tokens": 0, "done": False, "stop": None, "seconds": 0.0, "error": None} for role in models
    }
    lock = threading.Lock()
    stop = threading.Event()

    def stopping() -> bool:
        return stop.is_set() or (should_stop is not None and should_stop())

    def work(role, model, tok):
        t0 = time.perf_counter()
        last_decode = [0.0]

        def on_tokens(results):
            now = time.perf_counter()
            if now - last_decode[0] < interval / 2:
                return
            last_decode[0] = now
            text = tok.decode(results[0], skip_special_tokens=True)
            with lock:
                state[role].update(text=text, tokens=len(results[0]))

        try:
            ids = prompt_ids(tok, question, system_prompt)
            params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_at_answer=True)
            out = generate_completions(model, tok, [ids], params, on_tokens=on_tokens, should_stop=stopping)
            text = tok.decode(out.completion_ids[0], skip_special_tokens=True)
            with lock:
                state[role].update(text=text, tokens=len(out.completion_ids[0]), stop=out.stop_reasons[0])
        except Exception as e:  # shown next to that model's answer
            with lock:
                state[role]["error"] = f"{type(e).__name__}: {e}"
        finally:
            with lock:
                state[role].update(done=True, seconds=time.perf_counter() - t0)

    threads = [
        threading.Thread(target=work, args=(role, m, t), name=f"try-{role}", daemon=True)
        for role, (m, t, _spec) in models.items()
    ]
    for th in threads:
        th.start()
    try:
        while True:
            for th in threads:
                th.join(timeout=interval / max(1, len(threads)))
            with lock:
                snap = {role: dict(v) for role, v in state.items()}
            yield snap
            if all(v["done"] for v in snap.values()):
                return
    finally:  # the consumer went away (page closed, Stop pressed): end the generations
        stop.set()
        for th in threads:
            th.join(timeout=30)
