"""Evaluation: batched greedy decoding, accuracy with 95% Wilson intervals, paired McNemar tests.

Scoring uses the same extractor as the rewards (`answers.extract_answer`):
- accuracy (headline): the '####' answer, or else the last number in the output (flexible
  reading, fair to a base model that never writes '####');
- strict accuracy: only a '####' answer counts (what the training reward pays for);
- format rate: the output ends with a '#### <number>' line.
Base and trained are scored on the same problems, so their difference gets an exact (binomial)
McNemar test on the discordant pairs.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .answers import extract_answer, has_final_line
from .config import DEFAULT_SYSTEM_PROMPT, DataConfig, StageConfig
from .data import Problem, heldout_pool, load_gsm8k
from .generation import SamplingParams, generate_completions, use_fast_attention
from .models import load_model, model_label, models_root, quantize_int8, resolve_model
from .prompts import prompt_ids
from .rewards import is_correct

Z95 = 1.959963984540054


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval for k successes out of n (well-behaved near 0 and 1)."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # The bounds are exactly 0 at k = 0 and exactly 1 at k = n (centre - half only rounds to ~1e-17 there).
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (lo, hi)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: b, c = discordant pairs (only A right, only B right)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass
class EvalSettings:
    n: int = 100
    seed: int = 0
    max_new_tokens: int = 256
    batch_size: int = 32
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    source: str = "gsm8k"  # gsm8k (test split) or a generated task (held-out seeds)
    min_difficulty: int = 0
    max_difficulty: int = 99
    int8: bool = False
    extra: dict = field(default_factory=dict)  # stage options for generated tasks (max_digits, operators)

    def validate(self) -> EvalSettings:
        errs = []
        if not 1 <= self.n <= 5000:
            errs.append("N must be between 1 and 5000.")
        if not 8 <= self.max_new_tokens <= 2048:
            errs.append("max new tokens must be between 8 and 2048.")
        if not 1 <= self.batch_size <= 256:
            errs.append("batch size must be between 1 and 256.")
        if self.max_difficulty < self.min_difficulty:
            errs.append("the difficulty range is empty (max below min).")
        if errs:
            raise ValueError(" ".join(errs))
        return self


def eval_problems(
    settings: EvalSettings, data_cfg: DataConfig | None = None, exclude_questions: set[str] | None = None
) -> tuple[list[Problem], str]:
    """The problems to score: GSM8K test (or its offline stand-in), or held-out generated tasks."""
    data_cfg = data_cfg or DataConfig()
    stage = StageConfig(
        name="eval",
        source=settings.source,
        min_difficulty=settings.min_difficulty,
        max_difficulty=settings.max_difficulty,
        num_problems=settings.n,
    )
    for key, value in settings.extra.items():
        setattr(stage, key, value)
    if settings.source == "gsm8k":
        try:
            probs, origin = load_gsm8k("test", data_cfg)
            if exclude_questions:
                probs = [p for p in probs if p.question not in exclude_questions]
            import random

            sel = [p for p in probs if settings.min_difficulty <= p.difficulty <= settings.max_difficulty]
            sel = random.Random(settings.seed).sample(sel, min(settings.n, len(sel)))
            return sel, f"GSM8K test ({origin})"
        except Exception:
            pass
    pool = heldout_pool(stage, data_cfg, settings.n, settings.seed, exclude_questions)
    return pool.problems, pool.origin


def score_output(text: str, gold: str) -> dict:
    pred, how = extract_answer(text, fallback=True)
    return {
        "pred": pred,
        "how": how,
        "correct": is_correct(text, gold, strict=False),
        "strict_correct": is_correct(text, gold, strict=True),
        "has_format": has_final_line(text),
    }


def evaluate(
    model,
    tokenizer,
    problems: list[Problem],
    settings: EvalSettings,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """Greedy answers for every problem, scored. Returns {'records': [...], 'summary': {...}}."""
    t0 = time.perf_counter()
    records, gen_tokens = [], 0
    order = sorted(range(len(problems)), key=lambda i: len(problems[i].question))  # less padding per batch
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=0.0, stop_at_answer=True)
    by_index: dict[int, dict] = {}
    for start in range(0, len(order), settings.batch_size):
        if should_stop is not None and should_stop():
            break
        idx = order[start : start + settings.batch_size]
        batch = [prompt_ids(tokenizer, problems[i].question, settings.system_prompt) for i in idx]
        out = generate_completions(model, tokenizer, batch, params)
        gen_tokens += out.generated_tokens
        for i, ids, reason in zip(idx, out.completion_ids, out.stop_reasons):
            p = problems[i]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            by_index[i] = {
                "id": p.id,
                "question": p.question,
                "gold": p.answer,
                "difficulty": p.difficulty,
                "output": text,
                "tokens": len(ids),
                "stop": reason,
                **score_output(text, p.answer),
            }
        if progress is not None:
            progress(len(by_index), len(problems))
    records = [by_index[i] for i in range(len(problems)) if i in by_index]
    seconds = time.perf_counter() - t0
    return {"records": records, "summary": summarize(records, seconds, gen_tokens)}


def summarize(records: list[dict], seconds: float = 0.0, gen_tokens: int = 0) -> dict:
    n = len(records)
    k = sum(r["correct"] for r in records)
    ks = sum(r["strict_correct"] for r in records)
    kf = sum(r["has_format"] for r in records)
    by_d: dict[int, list[dict]] = {}
    for r in records:
        by_d.setdefault(int(r["difficulty"]), []).append(r)
    return {
        "n": n,
        "correct": k,
        "accuracy": k / n if n else 0.0,
        "ci": wilson_interval(k, n),
        "strict_accuracy": ks / n if n else 0.0,
        "strict_ci": wilson_interval(ks, n),
        "format_rate": kf / n if n else 0.0,
        "format_ci": wilson_interval(kf, n),
        "mean_tokens": sum(r["tokens"] for r in records) / n if n else 0.0,
        "by_difficulty": {
            str(d): {
                "n": len(rs),
                "accuracy": sum(r["correct"] for r in rs) / len(rs),
                "ci": wilson_interval(sum(r["correct"] for r in rs), len(rs)),
            }
            for d, rs in sorted(by_d.items())
        },
        "seconds": seconds,
        "tokens_per_s": gen_tokens / seconds if seconds > 0 else None,
    }


def paired(base: list[dict], trained: list[dict], key: str = "correct") -> dict:
    """McNemar on the same problems: b = only base right, c = only trained right."""
    tb = {r["id"]: r[key] for r in trained}
    pairs = [(r[key], tb[r["id"]]) for r in base if r["id"] in tb]
    b = sum(1 for x, y in pairs if x and not y)
    c = sum(1 for x, y in pairs if y and not x)
    n = len(pairs)
    diff = (sum(y for _, y in pairs) - sum(x for x, _ in pairs)) / n if n else 0.0
    return {
        "n": n,
        "only_base": b,
        "only_trained": c,
        "both": sum(1 for x, y in pairs if x and y),
        "neither": sum(1 for x, y in pairs if not x and not y),
        "difference": diff,
        "p_value": mcnemar_exact(b, c),
    }


# ------------------------------------------------------------------------------------------------
# Whole comparisons with caching
# ------------------------------------------------------------------------------------------------
def _model_fingerprint(name: str) -> str:
    spec = resolve_model(name)
    if spec.kind in ("local", "embedded"):
        p = Path(spec.ref)
        files = sorted(p.glob("*.safetensors"))
        return f"{spec.kind}:{p}:" + ",".join(f"{f.stat().st_size}-{int(f.stat().st_mtime)}" for f in files)
    return f"{spec.kind}:{spec.ref}"


def cache_key(models: list[str], settings: EvalSettings) -> str:
    blob = json.dumps({"models": [_model_fingerprint(m) for m in models], "settings": asdict(settings)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def eval_cache_dir() -> Path:
    return models_root() / "eval_cache"


def load_for_eval(name: str, int8: bool = False, restrict_paths: bool = False):
    model, tok, spec = load_model(name, restrict_paths=restrict_paths)
    if int8:
        model = quantize_int8(model)
    else:
        use_fast_attention(model)
    return model, tok, spec


def compare_models(
    base: str,
    trained: str,
    settings: EvalSettings,
    data_cfg: DataConfig | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    use_cache: bool = True,
    restrict_paths: bool = False,
    exclude_questions: set[str] | None = None,
) -> dict:
    """Evaluate two models on the same problems; cached per (models, settings, excluded questions).

    exclude_questions: problems never to score (e.g. a run's training questions, for held-out sets)."""
    settings.validate()
    key = cache_key([base, trained], settings)
    if exclude_questions:
        key += "-x" + hashlib.sha256("\n".join(sorted(exclude_questions)).encode()).hexdigest()[:8]
    path = eval_cache_dir() / f"compare-{key}.json"
    if use_cache and path.is_file():
        res = json.loads(path.read_text())
        res["cached"] = True
        for role, name in (("base", base), ("trained", trained)):  # (results cached before labels hid folders)
            res[f"{role}_label"] = model_label(name)
        return res
    problems, origin = eval_problems(settings, data_cfg, exclude_questions)
    result = {
        "base_model": base,
        "trained_model": trained,
        "settings": asdict(settings),
        "origin": origin,
        "created": time.time(),
    }
    for role, name in (("base", base), ("trained", trained)):
        if should_stop is not None and should_stop():
            raise InterruptedError("evaluation cancelled")
        model, tok, spec = load_for_eval(name, settings.int8, restrict_paths)
        res = evaluate(
            model,
            tok,
            problems,
            settings,
            progress=(lambda d, t, r=role: progress(r, d, t)) if progress else None,
            should_stop=should_stop,
        )
        result[role] = res
        result[f"{role}_label"] = spec.label
        del model
    if len(result["base"]["records"]) < len(problems) or len(result["trained"]["records"]) < len(problems):
        raise InterruptedError("evaluation cancelled")
    result["paired"] = paired(result["base"]["records"], result["trained"]["records"])
    result["paired_strict"] = paired(result["base"]["records"], result["trained"]["records"], "strict_correct")
    result["paired_format"] = paired(result["base"]["records"], result["trained"]["records"], "has_format")
    result["key"] = key
    save_compare(result, path)
    result["cached"] = False
    return result


def save_compare(result: dict, path: Path) -> None:
    from .fileio import atomic_write_json, atomic_write_text

    atomic_write_json(path, result)
    atomic_write_text(path.with_suffix(".csv"), compare_csv(result))


def compare_csv(result: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            "id",
            "difficulty",
            "question",
            "gold",
            "base_answer",
            "base_correct",
            "base_format",
            "trained_answer",
            "trained_correct",
            "trained_format",
            "base_output",
            "trained_output",
        ]
    )
    trained = {r["id"]: r for r in result["trained"]["records"]}
    for b in result["base"]["records"]:
        t = trained.get(b["id"], {})
        w.writerow(
            [
                b["id"],
                b["difficulty"],
                b["question"],
                b["gold"],
                b["pred"],
                int(b["correct"]),
                int(b["has_format"]),
                t.get("pred"),
                int(bool(t.get("correct"))),
                int(bool(t.get("has_format"))),
                b["output"],
                t.get("output", ""),
            ]
        )
    return buf.getvalue()


def headline(result: dict) -> dict:
    b, t, p = result["base"]["summary"], result["trained"]["summary"], result["paired"]
    return {
        "n": b["n"],
        "base_accuracy": b["accuracy"],
        "base_ci": b["ci"],
        "trained_accuracy": t["accuracy"],
        "trained_ci": t["ci"],
        "base_format": b["format_rate"],
        "trained_format": t["format_rate"],
        "p_value": p["p_value"],
    }


def evaluate_run_vs_base(run, n: int = 100, seed: int = 0, progress=None, should_stop=None) -> dict:
    """Compare a finished run's final model with its base model on GSM8K test; saved in run/eval/."""
    cfg = run.config()
    settings = EvalSettings(
        n=n, seed=seed, system_prompt=cfg.data.system_prompt, max_new_tokens=max(256, cfg.grpo.max_completion_length)
    )
    result = compare_models(cfg.model.name, str(run.final_dir), settings, cfg.data, progress, should_stop)
    save_compare(result, run.eval_dir / f"gsm8k-n{n}-seed{seed}.json")
    return headline(result)


# ------------------------------------------------------------------------------------------------
# Held-out evaluation of a run's own stage tasks
# ------------------------------------------------------------------------------------------------
def training_questions(cfg) -> set[str]:
    """Every question the run's stages train on (their pools, drawn exactly as the engine draws them)."""
    from .data import stage_pool

    seen: set[str] = set()
    for k, stage in enumerate(cfg.stages):
        seen.update(p.question for p in stage_pool(stage, cfg.data, seed=cfg.data.seed + k).problems)
    return seen


def stage_eval_settings(cfg, k: int, n: int, seed: int = 0, max_new_tokens: int | None = None) -> EvalSettings:
    """Settings that score problems like stage k's (GSM8K stages: the test split; generated: far seeds)."""
    st = cfg.stages[k]
    return EvalSettings(
        n=n,
        seed=seed,
        system_prompt=cfg.data.system_prompt,
        max_new_tokens=max_new_tokens or max(64, cfg.grpo.max_completion_length),
        source=st.source,
        min_difficulty=st.min_difficulty,
        max_difficulty=st.max_difficulty,
        extra={"max_digits": st.max_digits, "operators": st.operators, "negation": st.negation},
    )


def heldout_problems(cfg, k: int, settings: EvalSettings, exclude: set[str] | None = None) -> tuple[list[Problem], str]:
    """Held-out problems of stage k: never in any training pool of the run (checked question by question)."""
    exclude = training_questions(cfg) if exclude is None else exclude
    return eval_problems(settings, cfg.data, exclude_questions=exclude)
