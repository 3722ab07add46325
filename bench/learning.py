"""Does training work? Train a preset (with and without EWC), then score base and trained models on
held-out problems of each stage's task and on GSM8K test, paired (prints JSON, writes a chart).

    GRPO_APP_GSM8K_DIR=../shared/data/gsm8k python bench/learning.py --config classroom --ablation \\
        --n 200 --gsm8k-n 200 --out assets/learning.json

* Training runs are ordinary runs under models/runs/ (named learning-ewc / learning-noewc), so the
  app's Runs and Compare tabs show them too. The ablation is the same config and seeds with
  ewc.enabled=false (lambda = 0: no Fisher pass, no penalty).
* Held-out: generated tasks use a seed far from every training seed, and any question that is in a
  training pool of the run is dropped (counted in the output, not assumed). GSM8K stages and the
  GSM8K column use the test split.
* Forgetting: the model as it was at the end of stage 1 (base + the stage-1 anchor saved by the EWC
  run; stage 1 is the same in both variants) is scored on the generated stage tasks too, and paired
  with each final model ('after_stage1', 'paired.forgetting').
* `--matrix N`: each run's stage x task matrix (grpo_app/evaluation/stage_matrix.py: every stage-end model on N held-out
  problems of every stage's task, paired with the model before it; backward and forward transfer).
* Scoring: greedy decoding, the same answer reader as the rewards; 'accuracy' reads the '####'
  answer or else the last number; 'format' = last line is '#### <number>'. Intervals: 95% Wilson.
  Base vs trained: exact McNemar on the same problems.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPO_APP_GSM8K_DIR", str(ROOT.parent / "shared" / "data" / "gsm8k"))


def train_variant(cfg, name: str, root: Path) -> tuple[Path, float]:
    from grpo_app.core.fileio import read_jsonl
    from grpo_app.runs.manager import RunManager

    cfg.run.name = name
    manager = RunManager(root)  # the same job runner as the app: metrics, events, memory, checkpoints
    t0 = time.time()
    run = manager.start(cfg)
    print(f"# training {name} -> {run.path}", file=sys.stderr, flush=True)
    manager.wait()
    status = run.read_status().get("status")
    if status != "completed":
        raise SystemExit(f"run {run.id} ended {status}: {run.read_status().get('error')}")
    metrics = read_jsonl(run.metrics_path)
    print(f"# {name}: {len(metrics)} steps in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    return run.path, time.time() - t0


def score(model_name, problems, settings, label: str) -> dict:
    """A model's greedy answers, scored; a named model through the app's per-model cache (the base model
    answers a problem set once across runs of this bench), a loader (the after-stage-1 model) afresh."""
    from grpo_app.evaluation.scoring import evaluate, score_model

    t0, reused = time.time(), False
    if callable(model_name):
        model, tok = model_name()
        res = evaluate(model, tok, problems, settings)
    else:
        res, _, reused = score_model(model_name, problems, settings)
    print(
        f"#   {label}: acc {res['summary']['accuracy']:.3f} fmt {res['summary']['format_rate']:.3f} "
        f"({'cached' if reused else f'{time.time() - t0:.0f}s'})",
        file=sys.stderr,
        flush=True,
    )
    return res


def brief(summary: dict) -> dict:
    """The cells the JSON keeps per model and set, by difficulty included (GSM8K: calculation steps)."""
    keys = ("n", "correct", "accuracy", "ci", "strict_accuracy", "format_rate", "format_ci", "mean_tokens")
    out = {k: summary[k] for k in keys}
    out["by_difficulty"] = {
        d: {"n": v["n"], "correct": round(v["accuracy"] * v["n"]), "accuracy": v["accuracy"], "ci": v["ci"]}
        for d, v in summary.get("by_difficulty", {}).items()
    }
    return out


def chart(result: dict, html_path: Path, png_path: Path | None) -> None:
    from plotly.subplots import make_subplots

    sets = list(result["eval"].keys())
    models = result["models"]
    colors = {"base": "#999999", "after1": "#009E73", "ewc": "#0072B2", "noewc": "#E69F00"}
    names = {"base": "base", "after1": "after stage 1", "ewc": "trained (EWC)", "noewc": "trained (no EWC)"}
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Held-out greedy accuracy (95% CI)", "Final-answer line rate"))
    for m in models:
        cell = [result["eval"][s].get(m) for s in sets]  # None: not measured on that set
        acc = [c["accuracy"] if c else None for c in cell]
        lo = [c["accuracy"] - c["ci"][0] if c else 0 for c in cell]
        hi = [c["ci"][1] - c["accuracy"] if c else 0 for c in cell]
        fmt = [c["format_rate"] if c else None for c in cell]
        name = names.get(m, m)
        fig.add_bar(
            x=sets,
            y=acc,
            name=name,
            marker_color=colors.get(m),
            error_y={"type": "data", "array": hi, "arrayminus": lo},
            row=1,
            col=1,
        )
        fig.add_bar(x=sets, y=fmt, name=name, marker_color=colors.get(m), showlegend=False, row=1, col=2)
    fig.update_yaxes(tickformat=".0%", range=[0, 1])
    fig.update_layout(
        barmode="group",
        height=420,
        width=1100,
        title=f"{result['config']} preset on {result['machine']['cores']} CPU cores - base vs trained, held-out",
        template="plotly_white",
    )
    html_path.write_text(fig.to_html(include_plotlyjs="cdn", full_html=True))
    if png_path is not None:
        try:
            _png(fig, png_path)
        except Exception as e:  # noqa: BLE001 - the PNG is a convenience; the HTML and JSON are the record
            print(f"# PNG not written: {e}", file=sys.stderr)


def _png(fig, png_path: Path) -> None:
    """Render with the same headless Chromium the browser tests use (no kaleido needed)."""
    import tempfile

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        page_file = Path(tmp) / "chart.html"
        page_file.write_text(fig.to_html(include_plotlyjs=True, full_html=True))
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                args=["--headless", "--no-sandbox", "--disable-gpu"],
            )
            page = browser.new_page(viewport={"width": 1120, "height": 440})
            page.goto(page_file.as_uri())
            page.wait_for_selector(".main-svg")
            page.screenshot(path=str(png_path), full_page=True)
            browser.close()


def markdown(result: dict) -> str:
    """The README table: accuracy [95% CI] and format rate per set and model, the paired p-values."""
    names = {"base": "base", "after1": "after stage 1", "ewc": "trained, EWC", "noewc": "trained, no EWC"}

    def cell(c):
        return f"{c['accuracy']:.1%} [{c['ci'][0]:.1%}, {c['ci'][1]:.1%}] · {c['format_rate']:.0%}"

    cols = ["base", *(["after1"] if result.get("after_stage1") else []), *[m for m in result["models"] if m != "base"]]
    lines = ["| held-out set (n) | " + " | ".join(names.get(m, m) for m in cols) + " | paired p (McNemar) |",
             "|---|" + "---|" * (len(cols) + 1)]
    for set_name, ev in result["eval"].items():
        row = [f"{set_name} ({ev['n']})"]
        for m in cols:
            c = result.get("after_stage1", {}).get(set_name) if m == "after1" else ev.get(m)
            row.append(cell(c) if c else "—")
        pr = result["paired"][set_name]
        ps = [f"{k.replace('_vs_', ' vs ')} {v['p_value']:.2g}" for k, v in pr.items() if not k.endswith("_format")]
        lines.append("| " + " | ".join(row) + " | " + "; ".join(ps) + " |")
    return "\n".join(lines)


def main() -> None:
    from bench.common import machine
    from grpo_app.core.config import load_config
    from grpo_app.core.run_folder import RunDir, runs_root
    from grpo_app.evaluation.scoring import (
        CompareSpec,
        EvalSettings,
        gsm8k_test_leak,
        overlap_with_training,
        training_questions,
    )
    from grpo_app.evaluation.stats import paired

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="classroom")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--ablation", action="store_true", help="also train with EWC off (same seeds)")
    ap.add_argument("--n", type=int, default=200, help="held-out problems per generated stage task")
    ap.add_argument("--gsm8k-n", type=int, default=200, help="GSM8K test problems (0 = skip)")
    ap.add_argument("--eval-seed", type=int, default=0)
    ap.add_argument(
        "--runs",
        nargs="*",
        default=[],
        metavar="NAME=RUN_DIR",
        help="reuse trained runs, e.g. ewc=models/runs/x; other names (e.g. seed1=models/runs/y) are scored as more models",
    )
    ap.add_argument("--no-stage-sets", action="store_true", help="score only the GSM8K column, not the stage tasks")
    ap.add_argument(
        "--gsm8k-source",
        default="",
        choices=["", "local", "hub"],
        help="where the GSM8K column comes from (default: the run's own data.gsm8k; 'local' scores runs trained "
        "offline, whose setting never loads GSM8K, on the local test split: such runs trained on gsm_symbolic, "
        "templates of GSM8K test questions, so the column is marked not_held_out)",
    )
    ap.add_argument("--out", default="assets/learning.json")
    ap.add_argument("--tag", default="", help="added to the run names (learning-TAG-ewc), e.g. for runs side by side")
    ap.add_argument("--eval-batch", type=int, default=32, help="problems per generation batch when scoring")
    ap.add_argument("--matrix", type=int, default=0, metavar="N",
                    help="also the stage x task matrix of every trained run, N held-out problems per task (0 = off)")
    a = ap.parse_args()
    # Checked before any training, so a typo does not fail after the runs are done.
    from grpo_app.core.config import RUN_NAME_RE

    run_prefix = f"learning-{a.tag}" if a.tag else "learning"
    if not RUN_NAME_RE.match(f"{run_prefix}-noewc"):
        ap.error(f"--tag {a.tag!r}: use letters, digits, '-' and '_' (run names are at most 64 characters).")
    try:
        EvalSettings(batch_size=a.eval_batch).validate()
    except ValueError as e:
        ap.error(f"--eval-batch {a.eval_batch}: {e}")

    cfg = load_config(a.config, a.set)
    root = runs_root(cfg.run.output_dir)
    variants = {"ewc": []} if cfg.ewc.enabled else {"noewc": []}
    if a.ablation:
        variants = {"ewc": ["ewc.enabled=true"], "noewc": ["ewc.enabled=false"]}
    trained: dict[str, dict] = {}
    if any("=" not in x for x in a.runs):
        ap.error("--runs takes NAME=RUN_DIR pairs.")
    given = dict(x.split("=", 1) for x in a.runs)
    for name, extra in variants.items():
        if name in given:
            trained[name] = {"run": given[name], "train_seconds": None}
            continue
        vcfg = load_config(a.config, [*a.set, *extra])
        path, secs = train_variant(vcfg, f"{run_prefix}-{name}", root)
        trained[name] = {"run": str(path), "train_seconds": round(secs, 1)}
    for name, folder in given.items():  # reused runs beyond the variants: more models on the same problems
        if name not in trained:
            if name in ("base", "after1") or not RUN_NAME_RE.match(name):
                ap.error(f"--runs {name}=...: choose another name (letters, digits, '-', '_'; not base or after1).")
            trained[name] = {"run": folder, "train_seconds": None}

    # The problem sets, described as the app's Compare tab describes them (evaluation.CompareSpec): every
    # variant trains on the same problems, so any of the runs defines what is held out.
    ref_run = RunDir(Path(next(iter(trained.values()))["run"]))
    specs: dict[str, CompareSpec] = {}
    for k, st in enumerate(cfg.stages):
        if st.source != "gsm8k" and not a.no_stage_sets:  # (GSM8K stages are covered by the GSM8K column)
            specs[f"stage {k + 1}: {st.name}"] = CompareSpec.for_run(ref_run, f"stage:{k}", a.n, a.eval_seed)
    if a.gsm8k_n:
        specs["GSM8K test"] = CompareSpec.for_run(ref_run, "gsm8k", a.gsm8k_n, a.eval_seed, max_new_tokens=256)
        if a.gsm8k_source:
            specs["GSM8K test"].data_cfg = dataclasses.replace(specs["GSM8K test"].data_cfg, gsm8k=a.gsm8k_source)
    exclude = training_questions(cfg)
    sets: dict[str, tuple] = {}
    for set_name, spec in specs.items():
        spec.settings.batch_size = a.eval_batch
        probs, origin = spec.problems(exclude)
        sets[set_name] = (probs, spec.settings, origin)

    models = {"base": cfg.model.name, **{k: str(Path(v["run"]) / "final") for k, v in trained.items()}}
    # Forgetting: the model at the end of stage 1 (identical in both variants: same config and seeds up
    # to the first Fisher pass), from the stage-1 anchor the EWC run saved.
    stage1_end = None
    ewc_run = RunDir(Path(trained["ewc"]["run"])) if "ewc" in trained else None
    if ewc_run is not None and ewc_run.stage_end_weights(0) is not None:
        from grpo_app.evaluation.stage_matrix import (
            load_stage_model,  # (the matrix's loader: anchor, stage_ends/ or final/)
        )

        stage1_end = lambda: load_stage_model(ewc_run, 0, cfg.model.name)  # noqa: E731
    result: dict = {
        "config": a.config,
        "overrides": a.set,
        "machine": machine(),
        "models": list(models),
        "runs": trained,
        "eval": {},
        "paired": {},
    }
    for set_name, (probs, s, origin) in sets.items():
        print(f"# eval {set_name}: {len(probs)} problems ({origin})", file=sys.stderr, flush=True)
        recs = {m: score(path, probs, s, f"{set_name} / {m}") for m, path in models.items()}
        if stage1_end is not None and set_name != "GSM8K test":
            after1 = score(stage1_end, probs, s, f"{set_name} / after stage 1")
            result.setdefault("after_stage1", {})[set_name] = brief(after1["summary"])
            result["paired"].setdefault("forgetting", {})[set_name] = {
                m: paired(after1["records"], recs[m]["records"]) for m in models if m != "base"
            }
        result["eval"][set_name] = {m: brief(r["summary"]) for m, r in recs.items()}
        result["eval"][set_name]["origin"] = origin
        # checked against what each run's steps trained on (commuted terms count), not only the pools drawn again
        checks = [overlap_with_training(RunDir(Path(v["run"])), [p.question for p in probs], pools=exclude)
                  for v in trained.values()]
        result["eval"][set_name]["overlap_with_training"] = max((c["in_training"] for c in checks), default=0)
        if set_name == "GSM8K test" and origin.startswith("GSM8K"):  # trained on GSM8K test stories? (Compare's note)
            leaks = {m: gsm8k_test_leak(RunDir(Path(v["run"]))) for m, v in trained.items()}
            if any(leaks.values()):
                result["eval"][set_name]["not_held_out"] = {m: why for m, why in leaks.items() if why}
        pr = {}
        for m in models:
            if m == "base":
                continue
            pr[f"{m}_vs_base"] = paired(recs["base"]["records"], recs[m]["records"])
            pr[f"{m}_vs_base_strict"] = paired(recs["base"]["records"], recs[m]["records"], "strict_correct")
            pr[f"{m}_vs_base_format"] = paired(recs["base"]["records"], recs[m]["records"], "has_format")
        if "ewc" in recs and "noewc" in recs:
            pr["ewc_vs_noewc"] = paired(recs["noewc"]["records"], recs["ewc"]["records"])
        result["paired"][set_name] = pr
        for m in list(result["eval"][set_name]):
            if m in models:
                result["eval"][set_name][m].pop("n", None)
        result["eval"][set_name]["n"] = len(probs)

    if a.matrix:  # after stage k x task j, for each run (issue 42): grpo_app.evaluation.stage_matrix, as the CLI and the app
        from grpo_app.evaluation.stage_matrix import stage_matrix, summary_sentence

        result["matrix"] = {}
        for m, v in trained.items():
            print(f"# matrix of {m}", file=sys.stderr, flush=True)
            result["matrix"][m] = stage_matrix(RunDir(Path(v["run"])), n=a.matrix, seed=a.eval_seed)
            result["matrix"][m]["summary"] = summary_sentence(result["matrix"][m])

    out = ROOT / a.out if not Path(a.out).is_absolute() else Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    # The chart only needs the per-model entries.
    plot = {**result, "eval": {s: {m: v[m] for m in models} for s, v in result["eval"].items()}}
    if result.get("after_stage1"):
        plot["models"] = ["base", "after1", *[m for m in models if m != "base"]]
        for set_name, summary in result["after_stage1"].items():
            plot["eval"][set_name]["after1"] = summary
    chart(plot, out.with_suffix(".html"), out.with_suffix(".png"))
    print(json.dumps(result, indent=2))
    print("\n" + markdown(result), file=sys.stderr)


if __name__ == "__main__":
    main()
