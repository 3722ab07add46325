"""Evaluation: batched greedy decoding, accuracy with 95% Wilson intervals, paired McNemar tests (the
statistics themselves are in `evaluation/stats.py`).

Scoring uses the same extractor as the rewards (`answers.extract_answer`):
- accuracy (headline): the '####' answer, or else the last number in the output (flexible
  reading, fair to a base model that never writes '####');
- strict accuracy: only a '####' answer counts (what the training reward pays for);
- format rate: the output ends with a '#### <number>' line.
Base and trained are scored on the same problems, so their difference gets an exact (binomial)
McNemar test on the discordant pairs.

A comparison is described by a `CompareSpec` (which models, which problems: GSM8K test or held-out
problems like a run's stage k, never one the run trained on) and carried out by `run_compare`; the web
app, the CLI and `bench/learning.py` all build their comparisons this way.

pass@k (optional, `EvalSettings.pass_k` = K > 0): each problem also gets K sampled answers at
`pass_temperature`, scored like accuracy; pass@k for k = 1..K is the unbiased estimator of Chen et al.
(2021), 1 - C(n-c, k) / C(n, k) with c of the n = K samples right, averaged over problems, with a 95%
percentile bootstrap interval over problems (seeded, 2000 resamples). It shows how much of what a model
can do in K tries it does on the first: GRPO tends to raise pass@1 more than pass@K.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grpo_app.core.answers import extract_answer, has_final_line
from grpo_app.core.config import DEFAULT_SYSTEM_PROMPT, GENERATOR_OPTIONS, DataConfig, StageConfig
from grpo_app.core.data import Problem, heldout_pool, load_gsm8k
from grpo_app.core.models import load_model, model_label, models_root, quantize_int8, resolve_model
from grpo_app.core.prompts import prompt_ids
from grpo_app.core.rewards import is_correct
from grpo_app.evaluation.stats import paired, pass_k_curve, wilson_interval
from grpo_app.training.sampler import SamplingParams, generate_completions, packed_linears, use_fast_attention

MAX_PASS_K = 64


@dataclass
class EvalSettings:
    n: int = 100
    seed: int = 0
    max_new_tokens: int = 256
    batch_size: int = 32
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    # Text after each question in the user turn. A run's comparisons leave it empty: a data.training_hint is
    # for training only, and both models are asked the plain question (benches may ask with the hint too).
    after_question: str = ""
    source: str = "gsm8k"  # gsm8k (test split) or a generated task (held-out seeds)
    min_difficulty: int = 0
    max_difficulty: int = 99
    int8: bool = False
    extra: dict = field(default_factory=dict)  # stage options for generated tasks (max_digits, operators)
    pass_k: int = 0  # K sampled answers per problem for pass@1..K (0 = greedy accuracy only)
    pass_temperature: float = 1.0  # sampling temperature of those answers
    # Sample on oneDNN-packed copies of the weights (sampler.packed_linears), packed once per evaluate/sample_pass_k
    # call: the same model up to float rounding, 0.75x the time for a greedy batch of 32 on 2 cores
    # (bench/packed_sampling.py), one more copy of the weights in memory while the call runs.
    packed_weights: bool = True

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
        if not 0 <= self.pass_k <= MAX_PASS_K:
            errs.append(f"pass@k samples must be between 0 (off) and {MAX_PASS_K}.")
        if self.pass_k and not 0.05 <= self.pass_temperature <= 2.0:
            errs.append("the pass@k temperature must be between 0.05 and 2 (at 0 every sample is the greedy answer).")
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


def _weights_packed(fn):
    """Run `fn(model, tokenizer, problems, settings, ...)` with the model's weights packed once for the whole call
    (`settings.packed_weights`): they do not change while a model is scored, so its batches share one packing."""

    @functools.wraps(fn)
    def run(model, tokenizer, problems, settings, *args, **kwargs):
        with packed_linears(model, settings.batch_size, settings.packed_weights):
            return fn(model, tokenizer, problems, settings, *args, **kwargs)

    return run


@_weights_packed
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
        batch = [prompt_ids(tokenizer, problems[i].question, settings.system_prompt, settings.after_question) for i in idx]
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


# ------------------------------------------------------------------------------------------------
# pass@k
# ------------------------------------------------------------------------------------------------
@_weights_packed
def sample_pass_k(
    model,
    tokenizer,
    problems: list[Problem],
    settings: EvalSettings,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """`settings.pass_k` sampled answers per problem at `settings.pass_temperature`, scored like accuracy
    (flexible reading) and strictly; returns per-problem counts and the pass@k curves (`pass_k_curve`)."""
    k, t0 = settings.pass_k, time.perf_counter()
    per_batch = max(1, settings.batch_size // k)  # a problem's k samples share one prompt prefill
    records: list[dict] = []
    for start in range(0, len(problems), per_batch):
        if should_stop is not None and should_stop():
            break
        batch = problems[start : start + per_batch]
        ids = [prompt_ids(tokenizer, p.question, settings.system_prompt, settings.after_question) for p in batch for _ in range(k)]
        params = SamplingParams(
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.pass_temperature,
            stop_at_answer=True,
            seed=settings.seed * 1_000_003 + start,
        )
        out = generate_completions(model, tokenizer, ids, params)
        for j, p in enumerate(batch):
            texts = [tokenizer.decode(c, skip_special_tokens=True) for c in out.completion_ids[j * k : (j + 1) * k]]
            records.append(
                {
                    "id": p.id,
                    "difficulty": p.difficulty,
                    "n": k,
                    "correct": sum(is_correct(x, p.answer, strict=False) for x in texts),
                    "strict_correct": sum(is_correct(x, p.answer, strict=True) for x in texts),
                }
            )
        if progress is not None:
            progress(len(records), len(problems))
    return {
        "k": k,
        "temperature": settings.pass_temperature,
        "records": records,
        "curve": pass_k_curve([r["correct"] for r in records], k, seed=settings.seed),
        "strict_curve": pass_k_curve([r["strict_correct"] for r in records], k, seed=settings.seed),
        "seconds": time.perf_counter() - t0,
    }


def pass_k_rows(result: dict) -> list[list]:
    """[k, base pass@k, its interval, trained pass@k, its interval] for a comparison with pass@k."""
    b, t = result["base"].get("pass_k"), result["trained"].get("pass_k")
    if not b or not t:
        return []
    bc, tc = b["curve"], t["curve"]
    return [[k, bc["pass"][i], bc["ci"][i], tc["pass"][i], tc["ci"][i]] for i, k in enumerate(bc["k"])]


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
    st = asdict(settings)
    if not settings.pass_k:  # (keys of comparisons without pass@k stay what they were before it existed)
        st.pop("pass_k"), st.pop("pass_temperature")
    if not settings.after_question:  # (likewise for after_question)
        st.pop("after_question")
    st.pop("packed_weights")  # how the products are computed, not what is asked: the same answers (measured)
    blob = json.dumps({"models": [_model_fingerprint(m) for m in models], "settings": st}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def eval_cache_dir() -> Path:
    return models_root() / "eval_cache"


def problems_digest(problems: list[Problem]) -> str:
    """The problems themselves (ids, questions, gold answers), not how they were asked for: the same settings
    can draw other problems (GSM8K from a folder today, its offline stand-in yesterday)."""
    h = hashlib.sha256()
    for p in problems:
        h.update(f"{p.id}\x1f{p.question}\x1f{p.answer}\x1e".encode())
    return h.hexdigest()[:16]


def _one_model_path(name: str, settings: EvalSettings, digest: str) -> Path:
    return eval_cache_dir() / f"model-{cache_key([name], settings)}-p{digest}.json"


def _is_whole(res, n: int, pass_k: int) -> bool:
    """One model's result holds an answer to each of the n problems (and its pass@k samples when asked)."""
    if not isinstance(res, dict) or not isinstance(res.get("records"), list) or len(res["records"]) != n:
        return False
    return not pass_k or len((res.get("pass_k") or {}).get("records") or []) == n


def _cached_model_result(path: Path, n: int, pass_k: int) -> dict | None:
    """One model's cached answers when the file is whole (see _is_whole), else None."""
    from grpo_app.core.fileio import read_json

    res = read_json(path)
    return res if _is_whole(res, n, pass_k) else None


def load_for_eval(name: str, int8: bool = False, restrict_paths: bool = False):
    model, tok, spec = load_model(name, restrict_paths=restrict_paths)
    if int8:
        model = quantize_int8(model)
    else:
        use_fast_attention(model)
    return model, tok, spec


def score_model(
    name: str,
    problems: list[Problem],
    settings: EvalSettings,
    digest: str | None = None,
    use_cache: bool = True,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    restrict_paths: bool = False,
) -> tuple[dict, str, bool]:
    """One model's greedy answers to `problems` (and its pass@k samples when settings.pass_k), scored:
    (result, the model's label, whether it came from the cache). Cached per (model, settings, problems)
    once whole; an interrupted scoring returns what it has and caches nothing. `progress(done, total)`
    counts answers: n greedy, then n * K sampled."""
    k, n_p = settings.pass_k, len(problems)
    units = n_p * (1 + k)
    path = _one_model_path(name, settings, digest or problems_digest(problems))
    res = _cached_model_result(path, n_p, k) if use_cache else None
    if res is not None:
        if progress:
            progress(units, units)
        return res, resolve_model(name, restrict_paths).label, True
    model, tok, spec = load_for_eval(name, settings.int8, restrict_paths)
    res = evaluate(
        model,
        tok,
        problems,
        settings,
        progress=(lambda d, t: progress(d, units)) if progress else None,
        should_stop=should_stop,
    )
    if k and len(res["records"]) == n_p:
        res["pass_k"] = sample_pass_k(
            model,
            tok,
            problems,
            settings,
            progress=(lambda d, t: progress(n_p + d * k, units)) if progress else None,
            should_stop=should_stop,
        )
    del model
    if _is_whole(res, n_p, k):
        from grpo_app.core.fileio import atomic_write_json

        atomic_write_json(path, res)
    return res, spec.label, False


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
    """Evaluate two models on the same problems; cached per (models, settings, problems), and each model's
    answers per (model, settings, problems), so a second run compared with the same base on the same
    problems scores only the new model (greedy decoding over the same batches gives the same answers).

    exclude_questions: problems never to score (e.g. a run's training questions, for held-out sets)."""
    settings.validate()
    problems, origin = eval_problems(settings, data_cfg, exclude_questions)
    digest = problems_digest(problems)
    key = f"{cache_key([base, trained], settings)}-p{digest}"
    path = eval_cache_dir() / f"compare-{key}.json"
    if use_cache and path.is_file():
        res = json.loads(path.read_text())
        res["cached"] = True
        for role, name in (("base", base), ("trained", trained)):  # (results cached before labels hid folders)
            res[f"{role}_label"] = model_label(name)
        return res
    result = {
        "base_model": base,
        "trained_model": trained,
        "settings": asdict(settings),
        "origin": origin,
        "created": time.time(),
    }
    units = len(problems) * (1 + settings.pass_k)  # progress counts answers: n greedy, then n * K sampled
    result["reused"] = []
    for role, name in (("base", base), ("trained", trained)):
        if should_stop is not None and should_stop():
            raise InterruptedError("evaluation cancelled")
        res, label, reused = score_model(
            name,
            problems,
            settings,
            digest=digest,
            use_cache=use_cache,
            progress=(lambda d, t, r=role: progress(r, d, units)) if progress else None,
            should_stop=should_stop,
            restrict_paths=restrict_paths,
        )
        result[role], result[f"{role}_label"] = res, label
        if reused:
            result["reused"].append(role)
    if not all(_is_whole(result[role], len(problems), settings.pass_k) for role in ("base", "trained")):
        raise InterruptedError("evaluation cancelled")
    result["paired"] = paired(result["base"]["records"], result["trained"]["records"])
    result["paired_strict"] = paired(result["base"]["records"], result["trained"]["records"], "strict_correct")
    result["paired_format"] = paired(result["base"]["records"], result["trained"]["records"], "has_format")
    result["key"] = key
    save_compare(result, path)
    result["cached"] = False
    return result


def save_compare(result: dict, path: Path) -> None:
    from grpo_app.core.fileio import atomic_write_json, atomic_write_text

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
    spec = CompareSpec.for_run(run, "gsm8k", n=n, seed=seed)
    spec.name = f"gsm8k-n{n}-seed{seed}"
    result = compare_models(spec.base, spec.trained, spec.settings, spec.data_cfg, progress, should_stop)
    mark_not_held_out(spec, result)
    save_compare(result, run.eval_dir / f"{spec.name}.json")
    return headline(result)


# ------------------------------------------------------------------------------------------------
# Held-out evaluation of a run's own stage tasks
# ------------------------------------------------------------------------------------------------
def training_questions(cfg) -> set[str]:
    """Every question the run's stages train on (their pools, drawn exactly as the engine draws them)."""
    from grpo_app.core.data import stage_pool

    seen: set[str] = set()
    for k, stage in enumerate(cfg.stages):
        seen.update(p.question for p in stage_pool(stage, cfg.data, seed=cfg.data.seed + k).problems)
    return seen


def overlap_with_training(run, questions: list[str], pools: set[str] | None = None) -> dict:
    """How many of `questions` the run trained on, as written or with their terms in another order
    (`data.question_key`): checked against the problems its steps actually trained on (the run folder's
    trained_problems.jsonl, complete) and against its stage pools drawn again (`pools`, or drawn here), so a
    held-out set picked with the pools is still checked against what training really saw."""
    from grpo_app.core.data import question_key

    recorded = run.trained_questions() if run is not None else None
    if pools is None:
        pools = training_questions(run.config()) if run is not None else set()
    seen = set(pools) | (recorded or set())
    keys = {question_key(q) for q in seen}
    exact = [q for q in questions if q in seen]
    commuted = [q for q in questions if q not in seen and question_key(q) in keys]
    return {
        "n": len(questions),
        "in_training": len(exact) + len(commuted),
        "exact": len(exact),
        "commuted": len(commuted),
        "examples": (exact + commuted)[:3],
        "checked_against": "the problems its steps trained on and its stage pools" if recorded is not None
        else "its stage pools, drawn again (the run has no record of the problems its steps trained on)",
    }


def gsm8k_test_leak(run) -> str:
    """Why a GSM8K test score of `run` is not held out ('' when it is): a stage of the run trained on
    gsm_symbolic problems, the offline stand-in for GSM8K, whose templates are GSM8K test questions
    (data.GSM_SYMBOLIC_LEAK). Read from the stages the run actually started (their events say which
    source each used, fallbacks included); a run that started none is judged by its config."""
    from grpo_app.core.data import GSM_SYMBOLIC_LEAK

    cfg = run.config()
    started = {int(ev["stage"]): ev.get("source") for ev in run.events() if ev.get("event") == "stage_start" and "stage" in ev}
    names = []
    for k, st in enumerate(cfg.stages):
        source = started.get(k)
        if source is None and not started:  # (never started: what it would use offline)
            source = "gsm_symbolic" if st.source == "gsm_symbolic" or (st.source == "gsm8k" and cfg.data.gsm8k == "offline") else st.source
        if source == "gsm_symbolic":
            names.append(f"{k + 1} ({st.name})")
    if not names:
        return ""
    return f"The run trained stage {', '.join(names)} on {GSM_SYMBOLIC_LEAK}."


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
        extra={name: getattr(st, name) for name in GENERATOR_OPTIONS},
    )



# ------------------------------------------------------------------------------------------------
# A comparison: which models, which problems (one description for the app, the CLI and the benches)
# ------------------------------------------------------------------------------------------------
@dataclass
class CompareSpec:
    """Base vs trained on one problem set.

    `stage` (0-based) asks for held-out problems like the run's stage `stage`: drawn as that stage's
    problems are, minus every question of any of the run's training pools (checked, and the overlap is
    reported with the result). With a `run`, the result is also saved in the run's `eval/` folder as
    `name`.json (+ .csv)."""

    base: str
    trained: str
    settings: EvalSettings
    data_cfg: DataConfig = field(default_factory=DataConfig)
    run: object | None = None  # a runs.RunDir (duck-typed: config(), final_dir, eval_dir)
    stage: int | None = None
    name: str = ""
    what: str = ""

    @classmethod
    def for_run(
        cls,
        run,
        eval_set: str = "gsm8k",
        n: int = 100,
        seed: int = 0,
        max_new_tokens: int | None = None,
        min_difficulty: int = 0,
        max_difficulty: int = 99,
    ) -> CompareSpec:
        """A run's trained model vs its base. `eval_set` is 'gsm8k' or 'stage:K' (K 0-based)."""
        cfg = run.config()
        stage = parse_eval_set(eval_set, len(cfg.stages))
        if stage is not None:
            st = cfg.stages[stage]
            settings = stage_eval_settings(cfg, stage, n, seed, max_new_tokens=max_new_tokens)
            name = f"stage{stage + 1}-{st.name}-n{n}-seed{seed}"
            what = f"held-out problems like stage {stage + 1} ({st.name})"
        else:
            settings = EvalSettings(
                n=n,
                seed=seed,
                system_prompt=cfg.data.system_prompt,
                max_new_tokens=max_new_tokens or max(256, cfg.grpo.max_completion_length),
                min_difficulty=min_difficulty,
                max_difficulty=max_difficulty,
            )
            name = f"gsm8k-n{n}-seed{seed}-d{min_difficulty}-{max_difficulty}"
            what = f"GSM8K test, difficulty {min_difficulty}–{max_difficulty}"
        spec = cls(cfg.model.name, str(run.final_dir), settings, cfg.data, run, stage, name, what)
        return spec.validate()

    @classmethod
    def for_models(
        cls,
        base: str,
        trained: str,
        n: int = 100,
        seed: int = 0,
        max_new_tokens: int = 256,
        min_difficulty: int = 0,
        max_difficulty: int = 99,
        **settings,
    ) -> CompareSpec:
        """Any two models on GSM8K test problems (or its offline stand-in)."""
        es = EvalSettings(
            n=n,
            seed=seed,
            max_new_tokens=max_new_tokens,
            min_difficulty=min_difficulty,
            max_difficulty=max_difficulty,
            **settings,
        )
        name = f"gsm8k-n{n}-seed{seed}-d{min_difficulty}-{max_difficulty}"
        return cls(base, trained, es, DataConfig(), None, None, name, f"GSM8K test, difficulty {min_difficulty}–{max_difficulty}").validate()

    def validate(self) -> CompareSpec:
        self.settings.validate()
        if self.stage is not None and self.run is None:
            raise ValueError("held-out stage problems need a run (its training questions are left out).")
        return self

    def excluded_questions(self) -> set[str] | None:
        """The run's training questions when the problems must be held out, else None."""
        return training_questions(self.run.config()) if self.stage is not None else None

    def problems(self, exclude: set[str] | None = None) -> tuple[list[Problem], str]:
        """The problems this comparison scores, and where they come from."""
        if exclude is None:
            exclude = self.excluded_questions()
        return eval_problems(self.settings, self.data_cfg, exclude)

    def with_pass_k(self, k: int, temperature: float = 1.0) -> CompareSpec:
        """The same comparison, each model also sampled `k` times per problem at `temperature` (pass@1..k)."""
        self.settings.pass_k, self.settings.pass_temperature = int(k), float(temperature)
        if k:
            self.name += f"-pass{k}-t{temperature:g}"
        return self.validate()

    def label(self) -> str:
        """What is compared, in words a page may show: model names and run ids, never a server path."""
        return f"{self.what}: {model_label(self.base)} vs {model_label(self.trained)}"

    def key(self) -> str:
        """Equal for two requests that would compute the same result (used to join a queued job)."""
        return json.dumps([self.base, self.trained, asdict(self.settings), self.stage], sort_keys=True, default=str)


def mark_not_held_out(spec: CompareSpec, result: dict) -> None:
    """A run's score on real GSM8K test after it trained on GSM8K test stories gets `not_held_out` (why)."""
    if spec.stage is None and spec.run is not None and str(result.get("origin", "")).startswith("GSM8K"):
        leak = gsm8k_test_leak(spec.run)
        if leak:
            result["not_held_out"] = leak


def parse_eval_set(eval_set: str, n_stages: int) -> int | None:
    """'gsm8k' -> None; 'stage:K' -> K (0-based, checked against the run's stages); else ValueError."""
    eval_set = eval_set if isinstance(eval_set, str) else ""
    if eval_set == "gsm8k":
        return None
    if not eval_set.startswith("stage:"):
        raise ValueError(f"unknown problem set {eval_set[:40]!r}; use 'gsm8k' or 'stage:<k>'.")
    try:
        k = int(eval_set.split(":", 1)[1])
    except ValueError:
        k = -1
    if not 0 <= k < n_stages:
        raise ValueError(f"{eval_set[:40]!r}: the run has stages 0..{n_stages - 1}.")
    return k


def run_compare(spec: CompareSpec, report=None, should_stop=None, restrict_paths: bool = False) -> dict:
    """Carry out a comparison: held-out problems checked against the run's training pools, both models
    scored (cached per models + settings + exclusions), the result saved in the run's eval/ folder.

    `report(**fields)` receives progress (phase, base_done/total, trained_done/total)."""
    report = report or (lambda **fields: None)
    n = spec.settings.n * (1 + spec.settings.pass_k)  # answers: greedy, then the pass@k samples
    report(phase="loading problems", base_done=0, base_total=n, trained_done=0, trained_total=n)

    def prog(role, done, total):
        report(phase=f"evaluating the {role} model", **{f"{role}_done": done, f"{role}_total": total})

    exclude = None
    if spec.stage is not None:  # held-out: never a question the run trained on
        report(phase="collecting the run's training questions")
        exclude = spec.excluded_questions()
    result = compare_models(
        spec.base,
        spec.trained,
        spec.settings,
        spec.data_cfg,
        prog,
        should_stop,
        restrict_paths=restrict_paths,
        exclude_questions=exclude,
    )
    if exclude is not None:  # checked, not assumed: against what the steps really trained on too
        qs = [r["question"] for r in result["base"]["records"]]
        result["overlap_with_training"] = overlap_with_training(spec.run, qs, pools=exclude)
    mark_not_held_out(spec, result)
    if spec.run is not None:
        save_compare(result, spec.run.eval_dir / f"{spec.name}.json")
    result["what"] = spec.what
    return result
