"""Issue #21's upper bound: GRPO on only the GSM8K *train* problems the base model sometimes solves,
then the whole GSM8K test split, base vs trained, paired (prints JSON).

    GRPO_APP_GSM8K_DIR=../shared/data/gsm8k python bench/gsm8k_solvable.py --pool 512 --k 16 \\
        --ceiling-seconds 110 --train-seconds 230 --out assets/gsm8k_solvable.json

Why: on GSM8K about nine in ten groups of 8 answers are all wrong (docs/experiments.md, "The GSM8K
ceiling"), so a GSM8K stage mostly teaches nothing. This bench removes that waste as far as sampling
can: it samples `--k` answers to each of `--pool` seeded train problems (the stage's temperature), keeps
the "teachable" ones (1..k-1 right: a group can tell answers apart), and trains one GSM8K stage on them
alone, through the app's own job runner. It is a screen of what the lever can do at all, sized for a
GPU (CPU runs are possible with small settings, e.g. the smoke test); the time a preset may take is the
CPU's, and this bench does not claim one.

Phases, each with its own clock, the JSON rewritten after each (a run cut short keeps what it measured):

1. ceiling: pass@k of the base on the train pool (stops at --ceiling-seconds with the problems done), or
   the ceiling of an earlier run's JSON (--ceiling-from: the same teachable problems, no sampling);
2. train: a GSM8K folder whose train.jsonl holds only the teachable problems (the real test.jsonl beside
   it) and one stage on it, G = --group; stopped at --train-seconds (the app's stop: a checkpoint of the
   last whole step), or when its --steps are done;
3. the base's greedy answers to the test problems (and the dev set of phase 6, in the same load): on a GPU
   while it trains (another process), on a CPU after it (--base-while-training), so the training's step
   times are its own;
4. the trained model's greedy answers to the same problems; exact McNemar on flexible accuracy, strict
   accuracy and format, accuracy by difficulty (GSM8K's calculation steps);
5. if --test-k and time is left before --deadline-seconds: pass@k on the test problems, base and trained;
6. if --dev-n: the same greedy comparison on a *dev* set, --dev-n seeded GSM8K train problems outside the
   ceiling's pool (never sampled, never trained on). Screens compare variants here, not on test.

--weights DIR skips phases 1-3's sampling and training: it scores an earlier run's trained model (a final
folder or a checkpoint) against the base. --skip-test scores the dev set alone (trained here or --weights):
a screen of variants reads only the dev set, whose draw (--dev-seed) is the same whatever the --seed.

Nothing is selected on the test split: the pool, the filter and every setting come from train. Choosing
between variants by their test scores would be (docs/experiments.md says where that happened once):
choose by the dev set.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPO_APP_GSM8K_DIR", str(ROOT.parent / "shared" / "data" / "gsm8k"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.ceiling import by_difficulty  # noqa: E402
from bench.common import emit, machine  # noqa: E402


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def teachable(records: list[dict], k: int) -> list[dict]:
    """Problems a group can learn from: at least one right and one wrong answer among the k samples."""
    return [r for r in records if 0 < r["correct"] < k]


def reused_ceiling(path: Path, train_ids: set[str]) -> dict:
    """The ceiling a previous run of this bench measured (its JSON), checked against today's train split."""
    try:
        ceil = json.loads(path.read_text())["ceiling"]
        recs, k = ceil["records"], int(ceil["k"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--ceiling-from {path}: not a JSON written by this bench ({e})") from None
    missing = [r["id"] for r in recs if r["id"] not in train_ids]
    if missing:
        raise SystemExit(f"--ceiling-from {path}: {len(missing)} problems are not in this GSM8K train split "
                         f"(e.g. {missing[0]}); use the same train.jsonl")
    return {"from": str(path), "problems": len(recs), "k": k, "teachable": len(teachable(recs, k)), "records": recs}


def write_gsm8k_folder(folder: Path, source: Path, keep_ids: set[str]) -> int:
    """A GSM8K folder holding only the train rows whose problem id (gsm8k-train-<row>) is in keep_ids,
    in their original order, and the source's test split unchanged. Returns the rows written."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    with (source / "train.jsonl").open(encoding="utf-8") as src, (folder / "train.jsonl").open("w", encoding="utf-8") as dst:
        row = 0
        for line in src:
            if not line.strip():
                continue
            if f"gsm8k-train-{row}" in keep_ids:
                dst.write(line if line.endswith("\n") else line + "\n")
                n += 1
            row += 1
    shutil.copyfile(source / "test.jsonl", folder / "test.jsonl")
    return n


def dev_problems(train_probs: list, used_ids: set[str], n: int, seed: int) -> list:
    """`n` GSM8K train problems outside `used_ids` (the ceiling's pool), drawn with a seed of their own: a
    held-out part of train to choose between variants on, so the test split is only ever reported."""
    from grpo_app.core.data import HELDOUT_SEED_OFFSET

    rest = [p for p in train_probs if p.id not in used_ids]
    return random.Random(seed + HELDOUT_SEED_OFFSET).sample(rest, min(n, len(rest)))


def stage_config(a, folder: Path, n_problems: int):
    """The classroom preset's prompt, rewards and sampler, one GSM8K stage on `folder`, EWC off."""
    from grpo_app.core.config import StageConfig, load_config

    cfg = load_config("classroom", a.set)
    cfg.run.name = a.run_name
    cfg.run.seed = a.seed
    cfg.run.save_every = 0
    cfg.model.name = a.model
    cfg.model.dtype = "float32"
    cfg.data.gsm8k = "local"
    cfg.data.gsm8k_dir = str(folder)
    cfg.ewc.enabled = False
    g = cfg.grpo
    g.num_generations = a.group
    g.prompts_per_step = min(a.prompts, n_problems)
    g.max_completion_length = a.max_new_tokens
    g.micro_batch_size = a.micro_batch if (g.prompts_per_step * a.group) % a.micro_batch == 0 else 0
    if a.learning_rate:
        g.learning_rate = a.learning_rate
    # the classroom preset forces half its line-less answers' '####' line since 2026-11-26; this bench's
    # recorded runs did not, so it is off here unless asked for (JSONs written before the option lack it)
    g.force_answer_line = getattr(a, "force_answer_line", 0.0)
    cfg.stages = [
        StageConfig(
            name="gsm8k-teachable",
            source="gsm8k",
            min_difficulty=0,
            max_difficulty=99,
            steps=a.steps,
            num_problems=max(n_problems, g.prompts_per_step),
        )
    ]
    return cfg.validate()


def train(cfg, seconds: float, root: Path, while_training=None) -> dict:
    """Train `cfg` in a child process (the app's job runner); stop it after `seconds`. While it runs,
    `while_training()` runs here. Returns the run folder, how it ended and the model folder to load."""
    from grpo_app.core.fileio import read_jsonl
    from grpo_app.runs.manager import RunManager

    manager = RunManager(root, process=True)
    t0 = time.time()
    run = manager.start(cfg)
    log(f"training -> {run.path}")
    side = while_training() if while_training is not None else None
    while manager.active and time.time() - t0 < seconds:
        time.sleep(1.0)
    stopped = manager.active
    if stopped:
        log(f"stopping the run after {time.time() - t0:.0f}s")
        manager.stop()
    manager.wait()
    status = run.read_status()
    metrics = read_jsonl(run.metrics_path)
    out = {
        "run": str(run.path),
        "status": status.get("status"),
        "error": status.get("error"),
        "seconds": round(time.time() - t0, 1),
        "steps": len(metrics),
        "metrics": [
            {"step": m.get("step"), "reward": m.get("reward"), "correctness": (m.get("rewards") or {}).get("correctness"),
             "strict_format": (m.get("rewards") or {}).get("strict_format"), "frac_zero_std": m.get("frac_zero_std"),
             "completion_length": m.get("completion_length"), "loss": m.get("loss"), "grad_norm": m.get("grad_norm"),
             "step_seconds": m.get("step_seconds"), "gen_seconds": m.get("gen_seconds")}
            for m in metrics
        ],
        "side": side,
    }
    if (run.path / "final" / "model.safetensors").is_file():
        out["weights"] = str(run.path / "final")
    else:
        ck = run.latest_checkpoint()
        out["weights"] = ck["path"] if ck else None
    return out


def load_trained(base: str, weights: str):
    from grpo_app.evaluation.scoring import load_for_eval
    from grpo_app.training.engine import load_checkpoint_weights

    if Path(weights, "config.json").is_file():  # a final model folder
        model, tok, _ = load_for_eval(weights)
    else:  # a checkpoint: the base with the checkpoint's trained weights
        model, tok, _ = load_for_eval(base)
        load_checkpoint_weights(model, Path(weights))
    return model, tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-filter", action="store_true", help="the control: train on the whole pool, not the teachable part")
    ap.add_argument("--ceiling-from", default="", metavar="JSON",
                    help="reuse the ceiling (and so the teachable problems) of an earlier run's JSON: no sampling")
    ap.add_argument("--base-while-training", choices=["auto", "yes", "no"], default="auto",
                    help="score the base on test while the training runs (auto: on a GPU only; on a CPU it "
                         "would share the cores and slow the steps being timed)")
    ap.add_argument("--pool", type=int, default=512, help="train problems sampled for the ceiling (seeded)")
    ap.add_argument("--k", type=int, default=16, help="sampled answers per train problem")
    ap.add_argument("--temperature", type=float, default=0.8, help="the stage's sampling temperature")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--group", type=int, default=16, help="G of the training stage")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per training step")
    ap.add_argument("--micro-batch", type=int, default=32, help="completions per forward/backward chunk")
    ap.add_argument("--learning-rate", type=float, default=0.0, help="0 = the classroom preset's")
    ap.add_argument("--steps", type=int, default=1000, help="training steps at most (the clock usually stops it)")
    ap.add_argument("--force-answer-line", type=float, default=0.0,
                    help="grpo.force_answer_line of the stage (the classroom preset's 0.5 is not taken over)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more classroom overrides")
    ap.add_argument("--ceiling-seconds", type=float, default=110)
    ap.add_argument("--train-seconds", type=float, default=230)
    ap.add_argument("--deadline-seconds", type=float, default=0, help="whole bench; 0 = no pass@k phase limit")
    ap.add_argument("--test-n", type=int, default=0, help="test problems (0 = all 1319)")
    ap.add_argument("--test-k", type=int, default=0, help="pass@k samples on test for both models (0 = skip)")
    ap.add_argument("--batch", type=int, default=256, help="answers per sampler batch when scoring")
    ap.add_argument("--dev-n", type=int, default=0,
                    help="also score base and trained on this many train problems outside the ceiling's pool (0 = skip)")
    ap.add_argument("--weights", default="", metavar="DIR",
                    help="score this trained model (a run's final folder or checkpoint) instead of training one")
    ap.add_argument("--skip-test", action="store_true",
                    help="score on the dev set only (a screen: variants are chosen there, test stays unread)")
    ap.add_argument("--dev-seed", type=int, default=0,
                    help="seed of the dev draw, apart from --seed: every variant of a screen is scored on the same dev set")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-name", default="gsm8k-teachable")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.pool < 1 or not 2 <= a.k <= 64:
        ap.error("--pool must be at least 1 and --k between 2 and 64")
    if a.group < 2 or a.prompts < 1 or a.micro_batch < 1 or a.batch < 1 or a.steps < 1:
        ap.error("--group must be at least 2, and --prompts, --micro-batch, --batch and --steps at least 1")
    if a.ceiling_from and not Path(a.ceiling_from).is_file():
        ap.error(f"--ceiling-from {a.ceiling_from}: no such file")
    if a.weights and not any((Path(a.weights) / f).is_file() for f in ("model.safetensors", "adapter_model.safetensors")):
        ap.error(f"--weights {a.weights}: no trained weights there (name a run's final folder or a checkpoint)")
    if a.weights and not a.ceiling_from:
        ap.error("--weights needs --ceiling-from: that run's pool is kept out of the dev set")
    if a.dev_n < 0 or (a.skip_test and not a.dev_n):
        ap.error("--dev-n must be 0 or more, and --skip-test needs --dev-n")
    if a.test_k and a.skip_test:
        ap.error("--test-k samples the test split, which --skip-test leaves unread: drop one of them")
    t_start = time.time()

    import torch

    from grpo_app.core.config import DataConfig
    from grpo_app.core.data import gsm8k_dir, load_gsm8k
    from grpo_app.core.run_folder import runs_root
    from grpo_app.evaluation.scoring import EvalSettings, evaluate, load_for_eval, sample_pass_k
    from grpo_app.evaluation.stats import paired, pass_k_curve

    def settings(**kw) -> EvalSettings:
        s = EvalSettings(n=1, seed=a.seed, max_new_tokens=a.max_new_tokens, **kw).validate()
        s.batch_size = a.batch  # above the app's 256 on a GPU
        return s

    source = gsm8k_dir(DataConfig())
    train_probs, origin = load_gsm8k("train", DataConfig())
    test_probs, _ = load_gsm8k("test", DataConfig())
    if a.test_n:
        test_probs = random.Random(a.seed).sample(test_probs, min(a.test_n, len(test_probs)))
    pool = random.Random(a.seed).sample(train_probs, min(a.pool, len(train_probs)))
    result: dict = {
        "source": origin,
        "machine": machine(),
        "args": vars(a),
    }

    def save() -> None:
        result["seconds"] = round(time.time() - t_start, 1)
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1) + "\n")

    # 1. ceiling on the train pool (or the one a previous run of this bench measured)
    if a.ceiling_from:
        result["ceiling"] = reused_ceiling(Path(a.ceiling_from), {p.id for p in train_probs})
        recs, k_used = result["ceiling"]["records"], result["ceiling"]["k"]
        log(f"ceiling from {a.ceiling_from}: {len(recs)} problems, {result['ceiling']['teachable']} teachable")
    else:
        model, tok, _ = load_for_eval(a.model)
        log(f"model loaded in {time.time() - t_start:.0f}s on {next(model.parameters()).device}")
        t0 = time.time()
        ceil = sample_pass_k(
            model, tok, pool, settings(pass_k=a.k, pass_temperature=a.temperature),
            progress=lambda d, n: log(f"ceiling {d}/{n} problems, {time.time() - t0:.0f}s"),
            should_stop=lambda: time.time() - t0 > a.ceiling_seconds,
        )
        recs, k_used = ceil["records"], a.k
        result["ceiling"] = {
            "problems": len(recs),
            "of_pool": len(pool),
            "k": a.k,
            "temperature": a.temperature,
            "seconds": round(ceil["seconds"], 1),
            "pass": {str(k): round(p, 4) for k, p in zip(ceil["curve"]["k"], ceil["curve"]["pass"])
                     if k in (1, 2, 4, 8, 16, 32, 64) or k == a.k},
            "pass_ci_at_k": ceil["curve"]["ci"][-1],
            "any_correct": sum(r["correct"] > 0 for r in recs),
            "teachable": len(teachable(recs, a.k)),
            "success_counts": {str(c): sum(r["correct"] == c for r in recs) for c in range(a.k + 1)},
            "by_difficulty": {
                d: {"n": len(v), "any_correct": sum(r["correct"] > 0 for r in v),
                    f"pass@{a.k}": round(pass_k_curve([r["correct"] for r in v], a.k)["pass"][-1], 4)}
                for d, v in sorted(by_difficulty(recs).items())
            },
            "records": recs,
        }
        log(f"ceiling: {len(recs)} problems, {result['ceiling']['any_correct']} solved at least once, "
            f"{result['ceiling']['teachable']} teachable, pass@1 {result['ceiling']['pass']['1']:.3f}")
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    keep = recs if a.no_filter else teachable(recs, k_used)
    result["ceiling"]["trained_on"] = (
        "every problem of the pool sampled (control)" if a.no_filter else "the teachable problems"
    )
    save()
    if len(keep) < 2 and not a.weights:
        result["verdict"] = "fewer than 2 problems to train on"
        save()
        emit(result, None)
        return

    # 2-3. train on the teachable problems (or take --weights); score the base on test meanwhile
    test_settings = settings()
    dev = dev_problems(train_probs, {r["id"] for r in recs}, a.dev_n, a.dev_seed) if a.dev_n else []

    def base_eval():
        """The base's greedy answers to the test problems (unless --skip-test) and the dev set: one load."""
        m, t, _ = load_for_eval(a.model)
        res = {"test": None if a.skip_test else evaluate(m, t, test_probs, test_settings),
               "dev": evaluate(m, t, dev, test_settings) if dev else None}
        for name, r in res.items():
            if r is not None:
                log(f"base on {name}: {r['summary']['accuracy']:.4f} ({r['summary']['seconds']:.0f}s)")
        return res

    if a.weights:
        base = base_eval()
        result["train"] = {"weights": a.weights, "note": "not trained here: --weights"}
    else:
        tmp = Path(tempfile.mkdtemp(prefix="gsm8k-teachable-"))
        n_rows = write_gsm8k_folder(tmp, source, {r["id"] for r in keep})
        cfg = stage_config(a, tmp, n_rows)
        side = a.base_while_training == "yes" or (a.base_while_training == "auto" and torch.cuda.is_available())
        tr = train(cfg, a.train_seconds, runs_root(cfg.run.output_dir), while_training=base_eval if side else None)
        scored_beside = tr.pop("side")
        base = scored_beside if side else base_eval()
        result["train"] = {**tr, "teachable_rows": n_rows, "grpo": {
            k: getattr(cfg.grpo, k) for k in ("num_generations", "prompts_per_step", "micro_batch_size",
                                               "max_completion_length", "temperature", "learning_rate",
                                               "loss_type", "scale_rewards", "beta")}}
    save()
    if not result["train"]["weights"]:
        result["verdict"] = f"training left no weights ({tr['status']}: {tr['error']})"
        save()
        emit(result, None)
        return

    def brief(s: dict) -> dict:
        keys = ("n", "correct", "accuracy", "ci", "strict_accuracy", "format_rate", "mean_tokens", "by_difficulty")
        return {k: s[k] for k in keys}

    def compared(probs: list, b: dict, t: dict) -> dict:
        def cut(res: dict) -> dict:  # answers the budget cut off: their last number is rarely the answer
            return {"cut_at_budget": round(sum(r["stop"] == "length" for r in res["records"]) / max(1, len(res["records"])), 4)}

        return {
            "n": len(probs),
            "max_new_tokens": a.max_new_tokens,
            "base": brief(b["summary"]) | cut(b),
            "trained": brief(t["summary"]) | cut(t),
            "paired": {
                "flexible": paired(b["records"], t["records"]),
                "strict": paired(b["records"], t["records"], "strict_correct"),
                "format": paired(b["records"], t["records"], "has_format"),
            },
        }

    # 4. the trained model on the same test problems
    model, tok = load_trained(a.model, result["train"]["weights"])
    if not a.skip_test:
        trained = evaluate(model, tok, test_probs, test_settings)
        log(f"trained on test: {trained['summary']['accuracy']:.4f}")
        result["test"] = compared(test_probs, base["test"], trained)
        save()

    # 6 (before the optional pass@k). the dev set: train problems outside the pool, base and trained
    if dev:
        trained_dev = evaluate(model, tok, dev, test_settings)
        base_dev = base["dev"]
        result["dev"] = compared(dev, base_dev, trained_dev)
        result["dev"]["what"] = (f"{len(dev)} GSM8K train problems outside the ceiling's {len(recs)}-problem pool "
                                 f"(dev seed {a.dev_seed}), for choosing between variants")
        # which problems each model got right (flexible), so two variants' JSONs can be paired on the same set
        result["dev"]["ids"] = [p.id for p in dev]
        result["dev"]["right"] = {name: [r["id"] for r in res["records"] if r["correct"]]
                                  for name, res in (("base", base_dev), ("trained", trained_dev))}
        log(f"dev: base {base_dev['summary']['accuracy']:.4f}, trained {trained_dev['summary']['accuracy']:.4f}")
        save()

    # 5. pass@k on test, both models, if time is left
    if a.test_k:
        left = lambda: (a.deadline_seconds or 1e9) - (time.time() - t_start)  # noqa: E731
        pk: dict = {}
        for name in ("trained", "base"):
            if left() < 20:
                break
            if name == "base":
                model, tok, _ = load_for_eval(a.model)
            t0 = time.time()
            res = sample_pass_k(model, tok, test_probs, settings(pass_k=a.test_k, pass_temperature=a.temperature),
                                should_stop=lambda: left() < 10)
            pk[name] = {"problems": len(res["records"]), "seconds": round(time.time() - t0, 1),
                        "pass": res["curve"]["pass"], "ci": res["curve"]["ci"],
                        "strict_pass": res["strict_curve"]["pass"], "ids": [r["id"] for r in res["records"]],
                        "correct": [r["correct"] for r in res["records"]]}
            result["test_pass_k"] = pk
            save()
    emit({k: v for k, v in result.items() if k != "ceiling"} | {"ceiling": {k: v for k, v in result["ceiling"].items() if k != "records"}}, None)


if __name__ == "__main__":
    main()
