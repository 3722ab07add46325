"""Command line: the same engine as the web app, from YAML presets.

python -m grpo_app train --config quick [--set grpo.num_generations=4 ...]
python -m grpo_app resume <run_id>
python -m grpo_app eval --model <run id | hub id | folder | embedded> --n 100
python -m grpo_app compare --base embedded --trained <run id> --n 100
python -m grpo_app runs
python -m grpo_app validate --config classroom --set ewc.lam=10
python -m grpo_app explain [settings|rewards|presets]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _fmt_pct(x, ci=None) -> str:
    if x is None:
        return "-"
    s = f"{100 * x:.1f}%"
    if ci:
        s += f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return s


def _resolve_model_arg(name: str) -> str:
    """A run id names its trained model; anything else is passed through."""
    from .runs import RUN_ID_RE, runs_root

    if RUN_ID_RE.match(name) and "/" not in name and (runs_root() / name / "final").is_dir():
        return str(runs_root() / name / "final")
    return name


def _watch(manager, run, second_interrupt_aborts: bool = True) -> str:
    """Render progress of the manager's job until it ends; Ctrl-C asks for a clean stop (a second one
    aborts, unless `second_interrupt_aborts` is off: under torchrun the launcher forwards each Ctrl-C
    once more, and kills the processes itself if they have not stopped within its grace period)."""
    from tqdm import tqdm

    cfg = run.config()
    bar = tqdm(total=cfg.total_steps, unit="step", dynamic_ncols=True, file=sys.stdout)
    seen_events, last_step = 0, 0
    interrupted = False
    try:
        while True:
            try:
                snap = manager.snapshot()
                for ev in snap["events"][seen_events:]:
                    bar.write(_event_line(ev))
                seen_events = len(snap["events"])
                if snap["metrics"]:
                    m = snap["metrics"][-1]
                    if m["step"] > last_step:
                        bar.update(m["step"] - last_step)
                        last_step = m["step"]
                        bar.set_postfix_str(
                            f"{m['stage_name']} reward={m['reward']:.3f} len={m['completion_length']:.0f} "
                            f"{(m.get('tokens_per_s') or 0):.0f} tok/s rss={m['rss_mb']:.0f}MB"
                        )
                if not snap["active"]:
                    break
                time.sleep(0.5)
            except KeyboardInterrupt:
                if interrupted and second_interrupt_aborts:
                    raise
                if interrupted:
                    continue
                interrupted = True
                bar.write(
                    "Stopping (the step in progress is dropped; the last complete step's checkpoint is kept); "
                    + ("Ctrl-C again to abort." if second_interrupt_aborts else "torchrun ends the processes after 30 s.")
                )
                manager.stop()
    finally:
        bar.close()
    st = run.read_status()
    return st.get("status", "unknown")


def _event_line(ev: dict) -> str:
    kind = ev["event"]
    d = {k: v for k, v in ev.items() if k not in ("time", "event", "traceback", "top")}
    if kind == "stage_start":
        return (
            f"== stage {d['stage'] + 1} '{d['name']}': {d['problems']} problems from {d['origin']}; {d['steps']} steps"
            + (", EWC on" if d.get("ewc") else "")
            + (f", {d['device']} in {d['precision']}" if d.get("precision", "float32") != "float32" else "")
        )
    if kind == "fisher_done":
        return f"== Fisher after stage {d['stage'] + 1}: {d['samples']} samples ({d['source']}) in {d['seconds']:.1f}s"
    if kind == "error":
        return f"!! error: {d.get('message')}"
    return f"== {kind}: " + ", ".join(f"{k}={v}" for k, v in d.items())


def cmd_train(args) -> int:
    from .config import ConfigError, load_config
    from .estimate import check_step
    from .manager import RunManager
    from .runs import runs_root

    try:
        overrides = list(args.set or [])
        if args.name:
            overrides.append(f"run.name={args.name}")
        cfg = load_config(args.config, overrides)
        check_step(cfg)  # one step must fit this machine's memory and the step-time limit
    except ConfigError as e:
        print("Invalid configuration:\n" + "\n".join(f"  {p}: {m}" for p, m in e.errors), file=sys.stderr)
        return 2
    manager = RunManager(runs_root(cfg.run.output_dir))
    run = manager.start(cfg)
    print(f"Run {run.id} -> {run.path}")
    status = _watch(manager, run)
    return _finish(run, status)


def _finish(run, status: str) -> int:
    st = run.read_status()
    print(f"Run {run.id}: {status}" + (f" ({st.get('error')})" if st.get("error") else ""))
    if status == "completed":
        print(f"Trained model: {run.final_dir}")
    if status == "stopped":
        print(f"Resume with: python -m grpo_app resume {run.id}")
    peak = st.get("peak_rss_mb")
    if peak:
        print(f"Peak RSS: {peak:.0f} MB")
    return 0 if status in ("completed", "stopped") else 1


def cmd_resume(args) -> int:
    from .manager import RunManager
    from .runs import runs_root

    manager = RunManager(args.runs_dir or runs_root())
    try:
        run = manager.resume(args.run_id)
    except (ValueError, RuntimeError) as e:
        print(f"Cannot resume: {e}", file=sys.stderr)
        return 2
    print(f"Resuming {run.id}")
    return _finish(run, _watch(manager, run))


def cmd_eval(args) -> int:
    from .config import DataConfig
    from .evaluation import EvalSettings, eval_problems, evaluate, load_for_eval
    from .models import ModelError

    settings = EvalSettings(
        n=args.n,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        source=args.source,
        int8=args.int8,
    )
    try:
        settings.validate()
        model, tok, spec = load_for_eval(_resolve_model_arg(args.model), args.int8)
    except (ValueError, ModelError) as e:
        print(f"Cannot evaluate: {e}", file=sys.stderr)
        return 2
    problems, origin = eval_problems(settings, DataConfig())
    print(f"Evaluating {spec.label}{' (INT8)' if args.int8 else ''} on {len(problems)} problems from {origin}")
    from tqdm import tqdm

    bar = tqdm(total=len(problems), unit="problem", file=sys.stdout)

    def prog(done, total):
        bar.update(done - bar.n)

    res = evaluate(model, tok, problems, settings, progress=prog)
    bar.close()
    s = res["summary"]
    print(f"accuracy        {_fmt_pct(s['accuracy'], s['ci'])}  ({s['correct']}/{s['n']}, 95% Wilson interval)")
    print(f"strict accuracy {_fmt_pct(s['strict_accuracy'], s['strict_ci'])}  ('#### n' answers only)")
    print(f"format rate     {_fmt_pct(s['format_rate'], s['format_ci'])}  (ends with a '#### n' line)")
    for d, v in s["by_difficulty"].items():
        print(f"  difficulty {d}: {_fmt_pct(v['accuracy'], v['ci'])} (n={v['n']})")
    print(f"{s['seconds']:.1f} s, {s['tokens_per_s'] or 0:.0f} generated tokens/s")
    if args.out:
        out = Path(args.out)
        from .fileio import atomic_write_json

        atomic_write_json(out, {"model": spec.label, "settings": settings.__dict__, "origin": origin, **res})
        print(f"Saved {out}")
    return 0


def cmd_compare(args) -> int:
    from .evaluation import EvalSettings, compare_models, headline
    from .models import ModelError

    settings = EvalSettings(
        n=args.n, seed=args.seed, max_new_tokens=args.max_new_tokens, source=args.source, int8=args.int8
    )
    try:
        res = compare_models(
            _resolve_model_arg(args.base),
            _resolve_model_arg(args.trained),
            settings,
            progress=lambda role, d, t: print(f"\r{role}: {d}/{t}", end="", flush=True),
        )
    except (ValueError, ModelError) as e:
        print(f"Cannot compare: {e}", file=sys.stderr)
        return 2
    print()
    h = headline(res)
    print(f"{res['origin']}, n={h['n']}{' (cached)' if res.get('cached') else ''}")
    print(f"base     {_fmt_pct(h['base_accuracy'], h['base_ci'])}   format {_fmt_pct(h['base_format'])}")
    print(f"trained  {_fmt_pct(h['trained_accuracy'], h['trained_ci'])}   format {_fmt_pct(h['trained_format'])}")
    p = res["paired"]
    print(
        f"paired: only base right {p['only_base']}, only trained right {p['only_trained']}, "
        f"exact McNemar p = {p['p_value']:.4g}"
    )
    return 0


def cmd_runs(args) -> int:
    from .runs import list_runs, runs_root

    runs = list_runs(Path(args.runs_dir) if args.runs_dir else runs_root())
    if not runs:
        print("No runs yet.")
        return 0
    for r in runs:
        s = r.summary()
        rew = f"{s['final_reward']:.3f}" if isinstance(s["final_reward"], (int, float)) else "-"
        dur = f"{s['duration_s'] / 60:.1f} min" if s["duration_s"] else "-"
        print(f"{s['run_id']:<40} {s['status']:<12} {s['preset']:<12} steps {s['steps']:<9} reward {rew:<7} {dur}")
    return 0


def cmd_validate(args) -> int:
    from .config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.set or [])
    except ConfigError as e:
        print("Invalid configuration:\n" + "\n".join(f"  {p}: {m}" for p, m in e.errors), file=sys.stderr)
        return 2
    print(f"OK: preset '{cfg.preset}', {len(cfg.stages)} stages, {cfg.total_steps} steps")
    if args.show:
        print(cfg.to_yaml())
    return 0


def cmd_explain(args) -> int:
    from .config import describe_fields, list_presets, load_config
    from .rewards import reward_help

    what = args.what
    if what == "rewards":
        for name, text in reward_help().items():
            print(f"{name:<14} {text}")
    elif what == "presets":
        for name in list_presets():
            cfg = load_config(name, validate=False)
            print(f"{name:<12} {cfg.total_steps:>4} steps  {cfg.description}")
    else:
        for path, text, default in describe_fields():
            print(f"{path}  (default: {json.dumps(default)})\n    {text}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grpo_app", description="CPU GRPO Studio: training, evaluation, runs.")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train from a preset (configs/<name>.yaml) or a YAML file")
    t.add_argument("--config", "-c", default="quick", help="preset name or YAML path (default: quick)")
    t.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override, e.g. grpo.num_generations=4")
    t.add_argument("--name", help="run name")
    t.set_defaults(func=cmd_train)

    r = sub.add_parser("resume", help="continue a stopped or interrupted run from its last checkpoint")
    r.add_argument("run_id")
    r.add_argument("--runs-dir", default=None)
    r.set_defaults(func=cmd_resume)

    for name, fn, hlp in (("eval", cmd_eval, "score one model"), ("compare", cmd_compare, "base vs trained, paired")):
        e = sub.add_parser(name, help=hlp)
        if name == "eval":
            e.add_argument("--model", "-m", default="embedded", help="run id, hub id, folder or 'embedded'")
            e.add_argument("--batch-size", type=int, default=32)
            e.add_argument("--out", help="save records and summary as JSON")
        else:
            e.add_argument("--base", default="embedded")
            e.add_argument("--trained", required=True, help="run id, hub id or folder")
        e.add_argument("--n", type=int, default=100)
        e.add_argument("--seed", type=int, default=0)
        e.add_argument("--max-new-tokens", type=int, default=256)
        e.add_argument("--source", default="gsm8k", help="gsm8k, arithmetic or gsm_symbolic")
        e.add_argument("--int8", action="store_true", help="dynamic INT8 quantization of Linear layers")
        e.set_defaults(func=fn)

    ls = sub.add_parser("runs", help="list runs")
    ls.add_argument("--runs-dir", default=None)
    ls.set_defaults(func=cmd_runs)

    v = sub.add_parser("validate", help="check a config without training")
    v.add_argument("--config", "-c", default="quick")
    v.add_argument("--set", "-s", action="append", metavar="KEY=VALUE")
    v.add_argument("--show", action="store_true", help="print the resolved config")
    v.set_defaults(func=cmd_validate)

    x = sub.add_parser("explain", help="describe settings, rewards or presets")
    x.add_argument("what", nargs="?", default="settings", choices=["settings", "rewards", "presets"])
    x.set_defaults(func=cmd_explain)
    return p


def _train_in_processes(args) -> int:
    """`train` / `resume` as one of several processes started by `torchrun` / `accelerate launch`.

    Rank 0 creates (or reopens) the run folder, shows progress and owns every file in the run; the other
    processes receive the folder from it and train their replica there (see grpo_app/distributed.py)."""
    import signal
    import traceback

    from . import distributed
    from .config import ConfigError, load_config
    from .engine import train
    from .manager import RunManager
    from .models import pick_device
    from .runs import RunDir, runs_root

    main = distributed.is_main()
    resume = args.func is cmd_resume
    cfg = None
    if not resume:
        try:  # the same arguments on every process: a bad config fails everywhere, before any collective
            overrides = list(args.set or [])
            if args.name:
                overrides.append(f"run.name={args.name}")
            cfg = load_config(args.config, overrides)
        except ConfigError as e:
            if main:
                print("Invalid configuration:\n" + "\n".join(f"  {p}: {m}" for p, m in e.errors), file=sys.stderr)
            return 2
        device = pick_device(cfg.model.device)
    else:
        device = "auto"
    distributed.init(device)
    if not main:
        path = distributed.broadcast(None)
        if path is None:
            return 2  # rank 0 said why
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches every process; rank 0 decides the stop
        run = RunDir(Path(path))
        try:
            status = train(run.config(), run, resume=resume)
        except Exception:
            traceback.print_exc()
            return 1
        return 0 if status in ("completed", "stopped") else 1

    shared = []

    def share(run):
        distributed.broadcast(str(run.path))
        shared.append(run)

    try:
        if resume:
            manager = RunManager(args.runs_dir or runs_root())
            run = manager.resume(args.run_id, before_launch=share)
        else:
            manager = RunManager(runs_root(cfg.run.output_dir))
            run = manager.start(cfg, before_launch=share)
    except Exception as e:
        if not shared:  # the other processes are waiting for a run folder: tell them there is none
            distributed.broadcast(None)
        print(f"Cannot {'resume' if resume else 'start'}: {e}", file=sys.stderr)
        return 2
    print(f"{'Resuming' if resume else 'Run'} {run.id} -> {run.path} ({distributed.world_size()} processes)")
    return _finish(run, _watch(manager, run, second_interrupt_aborts=False))


def _launched_processes() -> int:
    """WORLD_SIZE set by `torchrun` / `accelerate launch` (1 otherwise); read without importing torch."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def main(argv: list[str] | None = None) -> int:
    from .system import quiet_libraries

    args = build_parser().parse_args(argv)
    if _launched_processes() > 1 and args.func in (cmd_train, cmd_resume):
        quiet_libraries()
        return _train_in_processes(args)
    quiet_libraries()
    return args.func(args)
