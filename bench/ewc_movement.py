"""How far each later stage moved the weights, and where: the EWC penalty's grip, measured (issue 42).

For a run and each stage k >= 2, the displacement d = theta(end of stage k) - theta(end of stage k-1) of
every weight the Fisher covers, grouped by how important the *first* stage's Fisher says the weight is
(top 1%, next 9%, next 40%, bottom half, by F), printed as JSON:

* `rms_in_lr`: the root-mean-square displacement in units of the learning rate (Adam moves a weight by about
  one learning rate per step, so a stage of S steps can move a weight at most ~S of these);
* `penalty_share`: the band's share of sum F d^2 (what the penalty charged for the stage's move);
* `moved`: the share of the band's weights that ended more than half a learning rate from where the stage
  began.

Runs without EWC have no Fisher of their own: `--fisher-from RUN` borrows one from a run of the same preset and
seed (stage 1 is the same in both, so its Fisher is the same). Measured on the weights the run kept for the ends
of its stages (the EWC anchors, or `stage_ends/`, or `final/`); nothing is trained or estimated.

    python bench/ewc_movement.py --runs <EWC run> <no-EWC run> --fisher-from <EWC run> --out assets/ewc_movement.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

from grpo_app.core.run_folder import RunDir  # noqa: E402
from grpo_app.runs.manager import RunManager  # noqa: E402

BANDS = (("top 1%", 0.99, None), ("1-10%", 0.90, 0.99), ("10-50%", 0.50, 0.90), ("bottom 50%", None, 0.50))


def _stage_weights(run: RunDir, k: int, names: set[str]) -> dict[str, torch.Tensor]:
    where = run.stage_end_weights(k)
    if where is None:
        raise SystemExit(f"run {run.id} kept no weights for the end of stage {k + 1}")
    kind, path = where
    if kind == "final":
        path = Path(path) / "model.safetensors"
    out = {}
    with safe_open(str(path), "pt") as f:
        for key in f.keys():
            name = key.split("::", 1)[1] if kind == "anchor" else key
            if kind == "anchor" and not key.startswith("anchor::"):
                continue
            if name in names:
                out[name] = f.get_tensor(key).float()
    return out


def _first_fisher(run: RunDir) -> dict[str, torch.Tensor]:
    path = run.ewc_dir / "stage-0" / "ewc.safetensors"
    if not path.is_file():
        raise SystemExit(f"run {run.id} has no stage-1 Fisher ({path.name}); pass --fisher-from an EWC run")
    with safe_open(str(path), "pt") as f:
        return {k.split("::", 1)[1]: f.get_tensor(k).float() for k in f.keys() if k.startswith("fisher::")}


def movement(run: RunDir, fisher: dict[str, torch.Tensor]) -> dict:
    cfg = run.config()
    names = set(fisher)
    flat = torch.cat([fisher[n].flatten() for n in sorted(names)])
    sample = flat[torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(0))[:2_000_000]]
    cuts = torch.quantile(sample, torch.tensor([0.99, 0.90, 0.50]))
    edges = {0.99: cuts[0].item(), 0.90: cuts[1].item(), 0.50: cuts[2].item()}
    stages = []
    prev = _stage_weights(run, 0, names)
    for k in range(1, len(cfg.stages)):
        cur = _stage_weights(run, k, names)
        lr = cfg.stages[k].learning_rate or cfg.grpo.learning_rate
        acc = {b[0]: {"n": 0, "d2": 0.0, "fd2": 0.0, "moved": 0} for b in BANDS}
        total_fd2 = 0.0
        for n in sorted(names):
            if n not in cur or n not in prev:
                continue
            d = (cur[n] - prev[n]).flatten()
            f = fisher[n].flatten()
            for label, lo, hi in BANDS:
                lo_v = -float("inf") if lo is None else edges[lo]
                hi_v = float("inf") if hi is None else edges[hi]
                m = (f > lo_v) & (f <= hi_v)
                if not m.any():
                    continue
                dm, fm = d[m], f[m]
                a = acc[label]
                a["n"] += int(m.sum())
                a["d2"] += float((dm * dm).sum())
                a["fd2"] += float((fm * dm * dm).sum())
                a["moved"] += int((dm.abs() > lr / 2).sum())
            total_fd2 += float((f * d * d).sum())
        bands = {
            label: {
                "weights": a["n"],
                "rms_in_lr": round((a["d2"] / max(a["n"], 1)) ** 0.5 / lr, 3),
                "penalty_share": round(a["fd2"] / total_fd2, 4) if total_fd2 else None,
                "moved": round(a["moved"] / max(a["n"], 1), 4),
            }
            for label, a in acc.items()
        }
        stages.append({
            "stage": k + 1, "name": cfg.stages[k].name, "steps": cfg.stages[k].steps, "lr": lr,
            "half_sum_F_d2": float(f"{0.5 * total_fd2:.6g}"), "bands": bands,
        })
        prev = cur
    return {"run": run.id, "ewc": bool(cfg.ewc.enabled), "lam": cfg.ewc.lam if cfg.ewc.enabled else 0,
            "seed": cfg.run.seed, "stages": stages}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="run ids (models/runs/<id>)")
    ap.add_argument("--fisher-from", default=None, help="a run whose stage-1 Fisher groups the weights")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    mgr = RunManager()
    shared = _first_fisher(mgr.get(args.fisher_from)) if args.fisher_from else None
    results = []
    for rid in args.runs:
        run = mgr.get(rid)
        results.append(movement(run, shared if shared is not None else _first_fisher(run)))
        print(json.dumps(results[-1]), flush=True)
    out = {"bench": "ewc_movement", "fisher_from": args.fisher_from, "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
