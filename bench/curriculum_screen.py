"""Screen curriculum stages on dev problems (issue 42): which task can a stage still teach? Scores models
on held-out problems like each stage of a config, greedy and never forced, and prints JSON.

    python bench/curriculum_screen.py --config FILE --models base=embedded after1=RUN_DIR:1 \\
        [trained=RUN_DIR] [--n 100] [--seed 1000] [--pass-k 8] --out assets/curriculum_screen.json

* A model is a model name or folder, a run folder (its final model) or RUN_DIR:K (the run's model as its
  stage K ended, 1 = first: `stage_matrix.load_stage_model`).
* The problems of task j are drawn as the matrix draws them (`CompareSpec`-like: the stage's generator at a
  far seed, minus every question of the config's training pools), but at `--seed` (default 1000), so the
  choice is made on *dev* problems and the matrix (seed 0) reports on others.
* `--pass-k K`: also K answers per problem sampled at temperature 0.8 (the presets' training temperature):
  pass@K says whether GRPO has anything to reinforce (a task no sample ever solves gives groups of equal
  rewards and no gradient). Off by default (it costs K times the greedy pass).
* Each cell also gives `modal_answer`: the task's most common right answer, its share of the problems (what a model
  that always wrote it would score), and the model's right answers split into those problems and the others, with
  how often it wrote that answer. One-digit taking-away stories come out as 1 about a third of the time, so a
  stage can look like it teaches while it learns to write 1 (measured 2026-12-03: one branch did).
* With `--before NAME[,NAME...]`: paired exact McNemar of each model against each model named there (a stage's
  model against the one before it: `--before n1,n2` pairs the stage-3 model with stage 2's as well).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPO_APP_GSM8K_DIR", str(ROOT.parent / "shared" / "data" / "gsm8k"))


def load(spec: str, base_name: str):
    """(model, tokenizer) for a model spec (see the module docstring)."""
    from grpo_app.core.run_folder import RunDir
    from grpo_app.evaluation.scoring import load_for_eval
    from grpo_app.evaluation.stage_matrix import load_stage_model

    head, _, tail = spec.rpartition(":")
    if head and tail.isdigit() and (Path(head) / "config.yaml").exists():
        return load_stage_model(RunDir(Path(head)), int(tail) - 1, base_name)
    if (Path(spec) / "final").is_dir():
        spec = str(Path(spec) / "final")
    model, tok, _ = load_for_eval(spec)
    return model, tok


def answer_breakdown(records: list[dict]) -> dict:
    """The task's most common right answer (`stats.modal_answer`) and how a model's records stand to it: `share` of
    the problems whose right answer it is (the score of a model that always wrote it), right answers on those problems
    (`right_modal`) and on the others (`right_other` of `n_other`), and how often the model wrote it (`wrote_modal`)."""
    from grpo_app.evaluation.stats import modal_answer

    top = modal_answer([r["gold"] for r in records])
    if top is None:
        return {}
    modal, share = top
    on = [r for r in records if r["gold"] == modal]
    off = [r for r in records if r["gold"] != modal]
    return {"answer": modal, "share": share, "right_modal": sum(bool(r["correct"]) for r in on),
            "n_modal": len(on), "right_other": sum(bool(r["correct"]) for r in off), "n_other": len(off),
            "wrote_modal": sum(r.get("pred") == modal for r in records)}


def main() -> None:
    from bench.common import emit, machine
    from grpo_app.core.config import load_config
    from grpo_app.evaluation.scoring import (
        eval_problems,
        evaluate,
        sample_pass_k,
        stage_eval_settings,
        training_questions,
    )
    from grpo_app.evaluation.stats import paired, wilson_interval

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--models", nargs="+", required=True, metavar="NAME=SPEC")
    ap.add_argument("--before", default="", help="pair every model with these (comma-separated NAMEs of --models)")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--pass-k", type=int, default=0)
    ap.add_argument("--tasks", default="", help="comma-separated stage numbers to score (1 = first; default all)")
    ap.add_argument("--batch", type=int, default=64, help="problems per generation batch")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if any("=" not in m for m in a.models):
        ap.error("--models takes NAME=SPEC pairs.")
    models = dict(m.split("=", 1) for m in a.models)
    befores = [b for b in a.before.split(",") if b]
    for b in befores:
        if b not in models:
            ap.error(f"--before {b}: not one of {', '.join(models)}.")
    cfg = load_config(a.config, a.set)
    exclude = training_questions(cfg)
    wanted = [int(x) - 1 for x in a.tasks.split(",") if x] or list(range(len(cfg.stages)))
    sets = {}
    for k in wanted:
        s = stage_eval_settings(cfg, k, a.n, a.seed)
        s.batch_size = a.batch
        probs, origin = eval_problems(s, cfg.data, exclude)
        if not probs:  # (a 0% from no problems would read as a result)
            print(f"# task {k + 1} ({cfg.stages[k].name}): no held-out problems left (all in the training pools); "
                  "skipped", file=sys.stderr)
            continue
        sets[f"{k + 1}: {cfg.stages[k].name}"] = (probs, s, origin)
    out = {"config": a.config, "overrides": a.set, "n": a.n, "seed": a.seed, "machine": machine(),
           "models": models, "tasks": {t: {"origin": o, "n": len(p)} for t, (p, _, o) in sets.items()}, "scores": {}}
    records: dict[str, dict[str, list]] = {}
    for name, spec in models.items():
        t0 = time.time()
        model, tok = load(spec, cfg.model.name)
        for task, (probs, s, _) in sets.items():
            res = evaluate(model, tok, probs, s)
            right = sum(r["correct"] for r in res["records"])
            cell = {"accuracy": res["summary"]["accuracy"], "ci": list(wilson_interval(right, len(probs))),
                    "format_rate": res["summary"]["format_rate"], "mean_tokens": res["summary"]["mean_tokens"],
                    "modal_answer": answer_breakdown(res["records"])}
            if a.pass_k:
                s.pass_k, s.pass_temperature = a.pass_k, 0.8
                counts = [r["correct"] for r in sample_pass_k(model, tok, probs, s)["records"]]
                s.pass_k = 0
                cell["pass_at_k"] = sum(c > 0 for c in counts) / len(counts)
                cell["sampled_accuracy"] = sum(counts) / (len(counts) * a.pass_k)
                # groups GRPO learns from: some samples right, some wrong (otherwise every advantage is 0)
                cell["mixed_groups"] = sum(0 < c < a.pass_k for c in counts) / len(counts)
            records.setdefault(name, {})[task] = res["records"]
            out["scores"].setdefault(name, {})[task] = cell
            print(f"# {name:>12} | {task:<28} acc {cell['accuracy']:.2f} fmt {cell['format_rate']:.2f}"
                  + (f" pass@{a.pass_k} {cell['pass_at_k']:.2f} mixed {cell['mixed_groups']:.2f}" if a.pass_k else ""), file=sys.stderr, flush=True)
        del model
        print(f"# {name}: {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    for i, b in enumerate(befores):  # each pair once: n2 is paired with n1 under n1, not n1 with n2 again under n2
        out["paired_vs_" + b] = {
            name: {task: paired(records[b][task], recs) for task, recs in by_task.items()}
            for name, by_task in records.items() if name != b and name not in befores[:i]
        }
    emit(out, a.out or None)


if __name__ == "__main__":
    main()
