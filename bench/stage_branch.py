"""Branch a run after its stage K: a new run that starts where the old one stood when stage K ended (its
weights, and with EWC its Fisher and anchors) and trains the later stages of another config (issue 42).

    python bench/stage_branch.py --from models/runs/<RUN> --after 2 --config configs/progressive.yaml \\
        [--set "stages[2].operators=+"] [--name NAME] \\
        [--allow grpo.prompts_per_step,grpo.num_generations,run.seed]

Why: a third stage can be screened in the time of one stage instead of the whole preset. The new run folder
gets the source's records of stages 1..K (metrics, what they trained on, their stage-end weights and EWC
state) and a checkpoint at the end of stage K holding the stage-K weights; `python -m grpo_app resume` then
runs stages K+1.. exactly as a resumed run does (`engine.train`: a checkpoint at a stage's end loads its
weights and EWC state and goes on with the next stage). The branch's config must equal the source's in the
first K stages and in model, data, rewards, GRPO and EWC settings (the EWC ones only where the penalty is on;
after stage 1, which never has a penalty, the branch may turn it off or change its strength λ) and the run seed
(checked; a difference is refused, but for the GRPO settings and the run seed named with `--allow`: they act only
in the stages the branch trains, so a screen of a later stage's grouping, advantage scaling or of another draw may
change them;
the stages before the branch keep the source's records either way). Against training straight through: each stage's trainer seeds itself
from the run seed and the stage's index when it is built (`settings.py`), and the sampler's from those and
the step, so a branch with the straight run's settings replays its stage K+1; measured once, a seed-42 branch
after stage 2 of `progressive` and the same preset trained straight through gave the same held-out matrix,
cell for cell.
With `stages[K].carry_moments` the branch's first stage starts from the optimizer moments the source ended stage
K with: they are copied from the source's checkpoint of that step (kept only if the source ran with
`run.keep_checkpoints` high enough; refused otherwise).
`branch.json` in the new folder says where it came from. Prints the new run's folder as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# EWC settings that only weigh the penalty in the stages after the first (the Fisher kept at stage 1's end does
# not depend on them): a branch after stage 1 may change them.
_PENALTY_ONLY = ("lam", "clip_penalty", "offload")
# Settings a branch may change with --allow: they act only in the stages it trains (sampling, grouping, advantage scaling).
ALLOWABLE = ("grpo.prompts_per_step", "grpo.num_generations", "grpo.micro_batch_size", "grpo.temperature",
             "grpo.scale_rewards", "run.seed")


def differences(src, cfg, k: int, allow: tuple[str, ...] = ()) -> list[str]:
    """Settings in which `cfg` may not differ from the source run's config `src` for a branch after k stages
    (`allow`: names from ALLOWABLE that may differ)."""
    out = []
    if len(cfg.stages) <= k:
        out.append(f"the config has {len(cfg.stages)} stages: nothing left to train after stage {k}")
    for j in range(min(k, len(src.stages), len(cfg.stages))):
        a, b = asdict(src.stages[j]), asdict(cfg.stages[j])
        out += [f"stages[{j}].{key}: {a[key]!r} in the source, {b.get(key)!r} here" for key in a if a[key] != b.get(key)]
    for section in ("model", "data", "rewards", "grpo", "ewc"):
        a, b = asdict(getattr(src, section)), asdict(getattr(cfg, section))
        if section == "ewc" and not (src.ewc.enabled or cfg.ewc.enabled):  # (no penalty: its settings do nothing)
            a, b = {"enabled": False}, {"enabled": False}
        elif section == "ewc" and k == 1 and not cfg.ewc.enabled:  # (stage 1 never has a penalty: dropping it
            a, b = {}, {}                                          # after stage 1 changes nothing before)
        elif section == "ewc" and k == 1 and src.ewc.enabled:  # (the penalty's strength was not used before stage 2)
            for key in _PENALTY_ONLY:
                a.pop(key, None), b.pop(key, None)
        out += [f"{section}.{key}: {a[key]!r} in the source, {b.get(key)!r} here" for key in a if a[key] != b.get(key)]
    if src.run.seed != cfg.run.seed:
        out.append(f"run.seed: {src.run.seed} in the source, {cfg.run.seed} here")
    return [d for d in out if d.split(":", 1)[0] not in allow]


def _jsonl_upto(path: Path, step: int) -> str:
    """The lines of a JSONL file whose 'step' is at most `step` (lines without one are kept)."""
    if not path.is_file():
        return ""
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or rec["step"] <= step:
            keep.append(line + "\n")
    return "".join(keep)


def branch(src_dir: Path, k: int, cfg, allow: tuple[str, ...] = ()) -> Path:
    """Create the branch's run folder (see the module docstring) and return it."""
    from safetensors.torch import save_file

    from grpo_app.core.fileio import atomic_write_json, atomic_write_text
    from grpo_app.core.run_folder import RunDir, read_anchor, runs_root
    from grpo_app.evaluation.stage_matrix import load_stage_model
    from grpo_app.training.engine import write_stage_end

    src = RunDir(src_dir)
    scfg = src.config()
    problems = differences(scfg, cfg, k, allow)
    if problems:
        raise SystemExit("cannot branch: " + "; ".join(problems))
    if src.stage_end_weights(k - 1) is None:
        raise SystemExit(f"{src.id} kept no weights for the end of stage {k}")
    end = Path(f"stage-{k - 1}") / f"checkpoint-{cfg.stages[k - 1].steps}"  # the checkpoint of stage k's last step
    src_ck = src.checkpoints_dir / end
    if cfg.stages[k].carry_moments and not (src_ck / "optimizer.pt").is_file():
        raise SystemExit(f"stage {k + 1} carries the optimizer moments stage {k} ended with (carry_moments), and "
                         f"{src.id} no longer has the checkpoint of stage {k}'s end that holds them; train the source "
                         "with run.keep_checkpoints high enough to keep it (or branch with carry_moments off)")
    offset = sum(s.steps for s in cfg.stages[:k])
    run = RunDir.create(runs_root(cfg.run.output_dir), cfg)
    for name in ("metrics.jsonl", "steps.jsonl", "trained_problems.jsonl", "memory.jsonl"):
        text = _jsonl_upto(src.path / name, offset)
        if text:
            atomic_write_text(run.path / name, text)
    for j in range(k):
        anchor_dir, own = src.ewc_dir / f"stage-{j}", src.stage_ends_dir / f"stage-{j}.safetensors"
        if cfg.ewc.enabled and anchor_dir.is_dir():
            shutil.copytree(anchor_dir, run.ewc_dir / f"stage-{j}")
        if own.is_file():
            run.stage_ends_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(own, run.stage_ends_dir / own.name)
        elif not cfg.ewc.enabled and (anchor_dir / "ewc.safetensors").is_file():
            # a branch without EWC keeps no anchors: its stage-j weights (the matrix's rows) go where a run
            # without EWC keeps them
            write_stage_end(read_anchor(anchor_dir / "ewc.safetensors"), run, j)
    model, tok = load_stage_model(src, k - 1, scfg.model.name)
    ck = run.checkpoints_dir / end
    ck.mkdir(parents=True)
    tied = getattr(model.config, "tie_word_embeddings", False)  # (a tied head is the embedding; saved once)
    state = {n: t.contiguous() for n, t in model.state_dict().items() if not (tied and n == "lm_head.weight")}
    save_file(state, str(ck / "model.safetensors"))
    atomic_write_json(ck / "trainer_state.json", {"global_step": cfg.stages[k - 1].steps, "branched_from": src.id})
    atomic_write_json(
        ck / "engine_state.json",
        {"stage_index": k - 1, "stage_step": cfg.stages[k - 1].steps, "global_step": offset,
         "ewc_stages": k if cfg.ewc.enabled else 0, "time": time.time()},
    )
    if cfg.stages[k].carry_moments:  # the moments stage k+1 starts from (engine.checkpoint_moments reads them)
        shutil.copy2(src_ck / "optimizer.pt", ck / "optimizer.pt")
    (ck / "COMPLETE").write_text(str(time.time()))
    atomic_write_json(run.path / "branch.json", {"from": src.id, "after_stage": k, "step": offset})
    return run.path


def main() -> None:
    from grpo_app.core.config import ConfigError, load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="src", required=True, help="the source run's folder")
    ap.add_argument("--after", type=int, required=True, help="branch after this stage (1 = first)")
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--name", default="", help="run.name of the branch")
    ap.add_argument("--allow", default="", help="comma-separated settings that may differ from the source's: "
                    + ", ".join(ALLOWABLE))
    ap.add_argument("--no-train", action="store_true", help="only create the folder")
    a = ap.parse_args()
    sets = list(a.set) + ([f"run.name={a.name}"] if a.name else [])
    try:
        cfg = load_config(a.config, sets)
    except (ConfigError, OSError) as e:
        raise SystemExit(f"cannot branch: {e}") from None
    if a.after < 1:
        raise SystemExit("--after: 1 or more")
    allow = tuple(x.strip() for x in a.allow.split(",") if x.strip())
    unknown = [x for x in allow if x not in ALLOWABLE]
    if unknown:
        raise SystemExit(f"--allow {', '.join(unknown)}: only {', '.join(ALLOWABLE)} may differ from the source")
    path = branch(Path(a.src), a.after, cfg, allow)
    rc = 0
    if not a.no_train:
        env = {**os.environ, "GRPO_APP_RUNS_DIR": str(path.parent)}
        rc = subprocess.run([sys.executable, "-m", "grpo_app", "resume", path.name], cwd=ROOT, env=env).returncode
    print(json.dumps({"run": str(path), "resume_rc": rc}))
    sys.exit(rc)


if __name__ == "__main__":
    main()
