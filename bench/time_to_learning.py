"""Time to learning: train a preset once and score held-out problems of its stage tasks as they stood at
fixed wall-clock points of the training (prints JSON: accuracy vs time, paired with the base model).

    GRPO_APP_GSM8K_DIR=../shared/data/gsm8k python bench/time_to_learning.py --config classroom \\
        --every 60 --n 200 --out assets/time_to_learning.json

How the clock and the snapshots work (so that scoring does not slow the training it measures):
* The clock starts when the run is started (the model load counts) and stops at each snapshot point.
* At the first optimizer step that ends after each `--every` seconds mark, the trainable weights are
  written to a temporary safetensors file (a bench-only trainer callback; about a second, subtracted
  from the clock, as is the copy of the final model's weights; on disk, so the run's peak RSS is the
  training's own). Nothing is scored while the run trains.
* `--at-steps 10,22` also snapshots at those global steps (the classroom's stage 1 ends at step 10).
* After training, each snapshot (base weights + the snapshot's trainable weights) and the base model are
  scored greedily on the same held-out problems of every generated stage task (none of them in any of the
  run's training pools, checked), with the app's evaluation (`evaluation.CompareSpec`, `evaluate`).
* Per point: accuracy with its 95% Wilson interval, format rate, the exact McNemar p against the base on
  the same problems, and whether the issue's classroom goal holds there (stage 1 >= +30 points, stage 2 >=
  +15, both p < 0.01, format >= 95%). Peak RSS of the training process is the run's own record.
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")

GOAL = {"min_gain": [0.30, 0.15], "p": 0.01, "format": 0.95}


class Snapshots:
    """Saves the trainable weights at the first step end past each wall-clock mark (bench instrumentation)."""

    def __init__(self, every: float, folder: Path, at_steps: frozenset[int] = frozenset()):
        self.every, self.folder, self.t0, self.paused = every, folder, None, 0.0
        self.at_steps = at_steps  # also snapshot at these global steps (e.g. the end of each stage)
        self.points: list[dict] = []
        self.total_steps = 0  # the run's, for the final snapshot

    def clock(self) -> float:
        return time.time() - self.t0 - self.paused

    def take(self, model, step: int, final: bool = False) -> None:
        from safetensors.torch import save_file

        t_mark = time.time()
        at = round(self.clock(), 1)
        path = self.folder / f"snap-{len(self.points)}.safetensors"
        save_file({n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}, str(path))
        self.points.append({"train_seconds": at, "step": step, "final": final, "path": path})
        self.paused += time.time() - t_mark

    def observer(self):
        """An `engine.Observer`: a snapshot at the first step end past each mark (and at `at_steps`), and
        one of the trained model just before it is written out."""
        from grpo_app.training.engine import Observer

        snaps = self

        class _Snap(Observer):
            def step_end(self, model, step, stage):
                marks = sum(1 for p in snaps.points if p.get("mark"))
                due = snaps.clock() >= snaps.every * (marks + 1)
                if due or step in snaps.at_steps:
                    snaps.take(model, step)
                    snaps.points[-1].update(mark=due, at_step=step in snaps.at_steps)

            def before_final_save(self, model):
                snaps.take(model, snaps.total_steps, final=True)  # the trained model, before it is written out

        return _Snap()


def hinted_sets(sets: dict, hint: str) -> dict:
    """The same problem sets asked with `hint` after each question (--with-hint); none without a hint."""
    if not hint:
        return {}
    return {name: (probs, dataclasses.replace(s, after_question=hint), origin, k)
            for name, (probs, s, origin, k) in sets.items()}


def brief(results: dict) -> dict:
    """Accuracy, its interval and the format rate of each set's evaluation."""
    return {name: {key: r["summary"][key] for key in ("accuracy", "ci", "format_rate")} for name, r in results.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="classroom")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--stages", type=int, default=0, help="train only the preset's first N stages (0 = all)")
    ap.add_argument("--every", type=float, default=60.0, help="seconds of training between snapshots")
    ap.add_argument("--n", type=int, default=200, help="held-out problems per generated stage task")
    ap.add_argument("--at-steps", default="", metavar="N,M",
                    help="also snapshot at these global steps (e.g. 10 = the classroom's end of stage 1)")
    ap.add_argument("--with-hint", action="store_true",
                    help="also score the base and every point asked with the run's data.training_hint "
                         "(the main scores ask the plain question, as Compare does)")
    ap.add_argument("--eval-seed", type=int, default=0)
    ap.add_argument("--eval-batch", type=int, default=32)
    ap.add_argument("--out", default="assets/time_to_learning.json")
    a = ap.parse_args()
    if a.every <= 0 or a.n < 1:
        ap.error("--every must be > 0 and --n at least 1")
    try:
        at_steps = frozenset(int(x) for x in a.at_steps.split(",") if x.strip())
    except ValueError:
        ap.error(f"--at-steps takes step numbers separated by commas, e.g. 10,22 (got {a.at_steps!r})")
    if any(k < 1 for k in at_steps):
        ap.error("--at-steps: steps count from 1")

    import tempfile

    import torch
    from safetensors.torch import load_file

    from grpo_app.core.config import load_config
    from grpo_app.core.run_folder import runs_root
    from grpo_app.evaluation.scoring import (
        CompareSpec,
        evaluate,
        load_for_eval,
        overlap_with_training,
        training_questions,
    )
    from grpo_app.evaluation.stats import paired
    from grpo_app.runs.manager import RunManager

    cfg = load_config(a.config, a.set)
    if a.stages:
        cfg.stages = cfg.stages[: a.stages]
        cfg.validate()
    cfg.run.name = cfg.run.name or "time-to-learning"
    tmp = tempfile.TemporaryDirectory(prefix="ttl-")
    snaps = Snapshots(a.every, Path(tmp.name), at_steps)

    snaps.total_steps = cfg.total_steps
    manager = RunManager(runs_root(cfg.run.output_dir))
    snaps.t0 = time.time()
    run = manager.start(cfg, observers=[snaps.observer()])  # the engine's supported hook (engine.Observer)
    print(f"# training {run.id}", file=sys.stderr, flush=True)
    manager.wait()
    wall = time.time() - snaps.t0
    st = run.read_status()
    if st.get("status") != "completed":
        raise SystemExit(f"run {run.id} ended {st.get('status')}: {st.get('error')}")

    exclude = training_questions(cfg)
    sets = {}
    for k, stage in enumerate(cfg.stages):
        if stage.source == "gsm8k":
            continue
        spec = CompareSpec.for_run(run, f"stage:{k}", a.n, a.eval_seed)
        spec.settings.batch_size = a.eval_batch
        probs, origin = spec.problems(exclude)
        sets[f"stage {k + 1}: {stage.name}"] = (probs, spec.settings, origin, k)

    hinted = hinted_sets(sets, cfg.data.training_hint) if a.with_hint else {}
    model, tok, _ = load_for_eval(cfg.model.name)

    def scores(sets, base) -> dict:
        out = {}
        for name, (probs, s, _, _k) in sets.items():
            res = evaluate(model, tok, probs, s)
            sm = res["summary"]
            out[name] = {
                "accuracy": sm["accuracy"],
                "ci": sm["ci"],
                "format_rate": sm["format_rate"],
                "gain": round(sm["accuracy"] - base[name]["summary"]["accuracy"], 4),
                "p_value": paired(base[name]["records"], res["records"])["p_value"],
            }
        return out

    base_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    base = {name: evaluate(model, tok, probs, s) for name, (probs, s, _, _) in sets.items()}
    base_hinted = {name: evaluate(model, tok, probs, s) for name, (probs, s, _, _) in hinted.items()}
    points = []
    for snap in snaps.points:
        weights = load_file(str(snap["path"]))
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(weights.get(n, base_weights[n]))
        row = {"train_seconds": snap["train_seconds"], "step": snap["step"], "final": snap["final"],
               "at_step": bool(snap.get("at_step")), "sets": scores(sets, base)}
        if hinted:
            row["with_hint"] = scores(hinted, base_hinted)
        gains = [v for v in row["sets"].values()]
        row["goal_met"] = len(gains) >= 2 and all(
            g["gain"] >= GOAL["min_gain"][i] and g["p_value"] < GOAL["p"] and g["format_rate"] >= GOAL["format"]
            for i, g in enumerate(gains[:2])
        )
        print(f"# t={row['train_seconds']:.0f}s step {row['step']}: {json.dumps(row['sets'])}", file=sys.stderr, flush=True)
        points.append(row)

    first = next((p for p in points if p["goal_met"]), None)
    result = {
        "config": a.config,
        "overrides": a.set,
        "command": "python bench/time_to_learning.py " + " ".join(sys.argv[1:]),
        "stages": [st.name for st in cfg.stages],  # all of the preset's, or its first --stages
        "run": run.id,
        "machine": {"cores": os.cpu_count(), "torch": torch.__version__},
        "every_s": a.every,
        "at_steps": sorted(at_steps),
        "run_wall_seconds_incl_load": round(wall, 1),
        "snapshot_copy_seconds": round(snaps.paused, 2),
        "peak_rss_mb": round(st.get("peak_rss_mb") or 0),
        "goal": GOAL,
        "base": brief(base),
        "base_with_hint": brief(base_hinted),
        "sets": {name: {"n": len(probs), "origin": origin,
                        # against what the run's steps trained on too; commuted terms count (issue 46)
                        "overlap_with_training": overlap_with_training(run, [p.question for p in probs],
                                                                       pools=exclude)["in_training"]}
                 for name, (probs, _, origin, _) in sets.items()},
        "points": points,
        "first_point_meeting_goal_s": first["train_seconds"] if first else None,
    }
    tmp.cleanup()
    out = Path(a.out) if Path(a.out).is_absolute() else ROOT / a.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
