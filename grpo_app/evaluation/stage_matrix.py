"""The curriculum matrix: after each stage k, the model as that stage ended, scored on held-out problems of
every stage's task j (issue 42).

Row k is the model at the end of stage k (`RunDir.stage_end_weights`: the EWC anchor, the weights a run
without EWC keeps, or final/ for the last stage); row "base" is the model before training. Column j is
held-out problems like stage j's (`CompareSpec.for_run(run, "stage:j")`: generated problems minus every
training question, or GSM8K test / the offline word problems for a word stage). Decoding is greedy and never
forced. Each cell has its accuracy with a 95% Wilson interval, and an exact McNemar p against the row above
(the model before that stage) on the same problems.

What the matrix says, in the continual-learning terms (Lopez-Paz & Ranzato 2017):
* plasticity, stage k: its own task's gain over the model before it, R[k][k] - R[k-1][k];
* backward transfer (BWT): the mean over earlier tasks j of R[last][j] - R[j][j] (negative = forgetting);
* forward transfer (FWT): the mean over later tasks j of R[j-1][j] - R[base][j] (what earlier stages gave a
  task before it was trained).
"""

from __future__ import annotations

from collections.abc import Callable

from grpo_app.core.fileio import atomic_write_json, read_json
from grpo_app.core.run_folder import RunDir
from grpo_app.evaluation.scoring import CompareSpec, evaluate, load_for_eval, problems_digest, score_model
from grpo_app.evaluation.stats import modal_answer, paired, wilson_interval


class MatrixError(ValueError):
    """The matrix cannot be computed for this run (the message says why and what to do)."""


def load_stage_model(run: RunDir, k: int, base_name: str):
    """The model as stage k ended: base weights + the stage's trainable weights (frozen ones are the base's)."""
    where = run.stage_end_weights(k)
    if where is None:
        raise MatrixError(
            f"run '{run.id}' kept no weights for the end of stage {k + 1} (runs from before the matrix keep them "
            "only with EWC; train it again)."
        )
    kind, path = where
    if kind == "final":
        model, tok, _ = load_for_eval(str(path))
        return model, tok
    model, tok, _ = load_for_eval(base_name)
    weights = run.stage_end_state(k)
    result = model.load_state_dict(weights, strict=False)
    if result.unexpected_keys or not weights:
        raise MatrixError(f"the weights kept for the end of stage {k + 1} do not fit the base model (a LoRA run?).")
    return model, tok


def _cell(records: list[dict], before: list[dict] | None) -> dict:
    n = len(records)
    right = sum(1 for r in records if r.get("correct"))
    lo, hi = wilson_interval(right, n)
    cell = {
        "accuracy": right / n if n else 0.0,
        "ci": [lo, hi],
        "correct": right,
        "n": n,
        "format_rate": sum(1 for r in records if r.get("has_format")) / n if n else 0.0,
    }
    if before is not None:
        pr = paired(before, records)
        cell["vs_before"] = {"delta": pr["difference"], "p_value": pr["p_value"], "only_before": pr["only_base"],
                             "only_after": pr["only_trained"]}
    return cell


def stage_matrix(
    run: RunDir,
    n: int = 50,
    seed: int = 0,
    max_new_tokens: int | None = None,
    progress: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """The matrix of `run` on `n` held-out problems per task (see the module docstring). Raises MatrixError.

    Saved in the run's eval/ folder (`matrix_path`) and read back by the next request for the same run, N, seed
    and budget while the run's final model is the one it was computed from: a matrix the CLI or a bench computed
    shows at once in the Compare tab."""
    saved = saved_matrix(run, n, seed, max_new_tokens)
    if saved is not None:
        return saved
    cfg = run.config()
    k_stages = len(cfg.stages)
    if cfg.model.lora:
        raise MatrixError("the stage x task matrix needs full weights at each stage end; LoRA runs do not keep them.")
    missing = [k + 1 for k in range(k_stages) if run.stage_end_weights(k) is None]
    if missing:
        raise MatrixError(f"run '{run.id}' has no weights for the end of stage {', '.join(map(str, missing))} "
                          "(an unfinished run, or one from before the matrix without EWC).")
    say = progress or (lambda text: None)
    tasks, sets = [], []
    for j, st in enumerate(cfg.stages):
        spec = CompareSpec.for_run(run, f"stage:{j}", n, seed, max_new_tokens=max_new_tokens)
        probs, origin = spec.problems()
        if not probs:  # e.g. one-digit operands: all 81 problems are in a 512-problem training pool
            raise MatrixError(f"stage {j + 1} ({st.name}) has no held-out problems left: every problem like it is "
                              "in the run's training pools. Give that stage a larger problem space (more digits).")
        modal, share = modal_answer([str(p.answer) for p in probs])
        tasks.append({"stage": j, "name": st.name, "origin": origin, "n": len(probs), "modal_answer": modal,
                      "modal_share": share})
        sets.append((probs, spec.settings))

    def stopped():
        return should_stop is not None and should_stop()

    base = []
    for j, (probs, settings) in enumerate(sets):
        say(f"base model on task {j + 1} of {k_stages}")
        res, _, _ = score_model(cfg.model.name, probs, settings, problems_digest(probs), should_stop=should_stop)
        base.append(res["records"])
        if stopped():
            raise InterruptedError("stopped")
    rows, before = [], base
    for k in range(k_stages):
        say(f"model after stage {k + 1} of {k_stages}: loading")
        model, tok = load_stage_model(run, k, cfg.model.name)
        recs = []
        for j, (probs, settings) in enumerate(sets):
            say(f"model after stage {k + 1} on task {j + 1} of {k_stages}")
            recs.append(evaluate(model, tok, probs, settings, should_stop=should_stop)["records"])
            if stopped():
                raise InterruptedError("stopped")
        del model
        rows.append([_cell(recs[j], before[j]) for j in range(k_stages)])
        before = recs
    base_cells = [_cell(recs, None) for recs in base]
    acc = [[c["accuracy"] for c in row] for row in rows]
    base_acc = [c["accuracy"] for c in base_cells]
    plasticity = [acc[k][k] - (acc[k - 1][k] if k else base_acc[k]) for k in range(k_stages)]
    last = k_stages - 1
    bwt = sum(acc[last][j] - acc[j][j] for j in range(last)) / last if last else None
    fwt = sum(acc[j - 1][j] - base_acc[j] for j in range(1, k_stages)) / last if last else None
    result = {
        "run_id": run.id,
        "final_model": _final_stamp(run),
        "ewc": ewc_settings(cfg),
        "stages": [st.name for st in cfg.stages],
        "tasks": tasks,
        "n": n,
        "seed": seed,
        "base": base_cells,
        "rows": rows,
        "plasticity": plasticity,
        "backward_transfer": bwt,
        "forward_transfer": fwt,
    }
    try:
        atomic_write_json(matrix_path(run, n, seed, max_new_tokens), result)
    except OSError:  # a full disk or a read-only run folder: the result is still returned
        pass
    return result


def matrix_path(run: RunDir, n: int, seed: int, max_new_tokens: int | None = None):
    """Where the matrix of `run` for (N, seed, budget) is kept: eval/matrix-n{N}-seed{S}[-t{budget}].json."""
    return run.eval_dir / f"matrix-n{n}-seed{seed}{f'-t{max_new_tokens}' if max_new_tokens else ''}.json"


def _final_stamp(run: RunDir) -> str:
    """Identifies the run's trained model (its weight files' sizes and times): a saved matrix of another is stale."""
    files = sorted(run.final_dir.glob("*.safetensors")) if run.final_dir.is_dir() else []
    return ";".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)


def saved_matrix(run: RunDir, n: int, seed: int, max_new_tokens: int | None = None) -> dict | None:
    """The saved matrix for these settings, if it was computed from the run's present final model. A matrix
    saved before the per-stage λ were recorded gets them from the run's config (they label the matrix)."""
    data = read_json(matrix_path(run, n, seed, max_new_tokens))
    if not isinstance(data, dict) or not data.get("rows") or data.get("final_model") != _final_stamp(run):
        return None
    if isinstance(data.get("ewc"), dict) and "stage_lams" not in data["ewc"]:
        try:
            data["ewc"] = ewc_settings(run.config())
        except (OSError, ValueError):  # an unreadable config (ConfigError is a ValueError): the label stays
            pass
    return data


def ewc_settings(cfg) -> dict:
    """The penalty as the run trained: on or off, the run's λ and each stage's (`Config.stage_ewc_lam`)."""
    lams = [cfg.stage_ewc_lam(k) for k in range(len(cfg.stages))]
    return {"enabled": bool(cfg.ewc.enabled), "lam": float(cfg.ewc.lam), "stage_lams": lams}


def ewc_label(m: dict, lam: str = "λ") -> str:
    """How a matrix's run was penalised, for its title: "no EWC", "EWC λ 10", or "EWC λ 10; stage 3 λ 3" where a
    later stage trained under its own λ (a matrix labelled with the run's λ alone would misstate that stage)."""
    e = m.get("ewc") or {}
    if not e.get("enabled"):
        return "no EWC"
    run_lam = float(e.get("lam", 0.0))
    own = [(k + 1, x) for k, x in enumerate(e.get("stage_lams") or []) if k and float(x) != run_lam]
    text = f"EWC {lam} {run_lam:g}"
    if own:
        text += "; " + ", ".join(f"stage {k} {lam} {x:g}" for k, x in own)
    return text


def floor_clause(task: dict) -> str:
    """What a constant answer would score on a task, as a clause to append to the task's line ('; its most common
    answer, ...'; '' for a matrix saved before tasks carried it)."""
    if task.get("modal_answer") is None:
        return ""
    return (f"; its most common answer, {task['modal_answer']}, is right on {100 * task['modal_share']:.0f}% of them "
            "(what a model that always wrote it would score)")


def summary_sentence(m: dict) -> str:
    """Backward and forward transfer in words a student understands."""

    def pts(x):
        return f"{100 * x:+.1f} points"

    parts = []
    gains = ", ".join(f"stage {k + 1} {pts(g)}" for k, g in enumerate(m["plasticity"]))
    parts.append(f"Each stage on its own task, against the model before it (plasticity): {gains}.")
    if m.get("backward_transfer") is not None:
        bwt = m["backward_transfer"]
        verdict = ("the final model forgot part of what earlier stages taught" if bwt < -0.005 else
                   "the final model kept what earlier stages taught" if bwt <= 0.005 else
                   "later stages even improved the earlier tasks")
        parts.append(f"Backward transfer {pts(bwt)}: on the earlier stages' tasks, {verdict} "
                     "(final model against the model right after each stage).")
    if m.get("forward_transfer") is not None:
        parts.append(f"Forward transfer {pts(m['forward_transfer'])}: what the earlier stages already gave each later "
                     "task before it was trained (model before the stage against the base).")
    return " ".join(parts)
