"""Command line: the same engine as the web app, from YAML presets.

python -m grpo_app train --config quick [--set grpo.num_generations=4 ...]
python -m grpo_app resume <run_id>
python -m grpo_app eval --model <run id | hub id | folder | embedded> --n 100
python -m grpo_app compare --base embedded --trained <run id> --n 100
python -m grpo_app runs
python -m grpo_app export <run_id> --format gguf|safetensors [--quant f32|f16|q8_0] [--out PATH] [--push owner/name]
python -m grpo_app answers <run_id> [--problem ID] [--step N] [--full] [--what-if correctness=1,brevity=0.5]
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

from grpo_app.core.config import _cut

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _fmt_pct(x, ci=None) -> str:
    if x is None:
        return "-"
    s = f"{100 * x:.1f}%"
    if ci:
        s += f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return s


def _resolve_model_arg(name: str) -> str:
    """A run id names its trained model (`runs.resolve_run`: a symlinked run folder is not one); anything else is
    passed through."""
    from grpo_app.core.run_folder import resolve_run, runs_root

    try:
        run = resolve_run(runs_root(), name)
    except ValueError:
        return name
    if not run.has_final_model():
        raise ValueError(f"run '{run.id}' has no trained model yet (a run saves one when it completes).")
    return str(run.final_dir)


def _print_config_error(e) -> None:
    """One line for one problem, a list for several; a message is never longer than a line or two."""
    lines = [f"{_cut(p, 80)}: {_cut(m, 300)}" for p, m in e.errors]
    if len(lines) == 1:
        print(f"Invalid configuration: {lines[0]}", file=sys.stderr)
    else:
        print("Invalid configuration:\n" + "\n".join(f"  {line}" for line in lines), file=sys.stderr)


def _runs_dir(path) -> Path:
    """The runs folder to use; ValueError when it exists and is not a folder."""
    from grpo_app.core.run_folder import runs_root

    root = Path(path) if path else runs_root()
    if root.exists() and not root.is_dir():
        raise ValueError(
            f"the runs folder {root} is a file, not a folder; point GRPO_APP_RUNS_DIR or --runs-dir "
            "(run.output_dir for train) at a folder."
        )
    return root


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
    from grpo_app.core.config import ConfigError, load_config
    from grpo_app.core.run_folder import runs_root
    from grpo_app.runs.manager import RunManager
    from grpo_app.training.estimate import check_step

    try:
        overrides = list(args.set or [])
        if args.name:
            overrides.append(f"run.name={args.name}")
        cfg = load_config(args.config, overrides)
        check_step(cfg)  # one step must fit this machine's memory and the step-time limit
    except ConfigError as e:
        _print_config_error(e)
        return 2
    try:
        manager = RunManager(_runs_dir(runs_root(cfg.run.output_dir)))
        run = manager.start(cfg)
    except (ValueError, RuntimeError, OSError) as e:  # another training in this runs folder, a bad folder
        print(f"Cannot start: {e}", file=sys.stderr)
        return 2
    print(f"Run {run.id} -> {run.path}")
    status = _watch(manager, run)
    return _finish(run, status)


def _compare_matrix(args) -> int:
    """`compare --run ID --matrix`: after each stage, its model on held-out problems of every stage's task."""
    from grpo_app.core.models import ModelError
    from grpo_app.evaluation.stage_matrix import MatrixError, ewc_label, floor_clause, stage_matrix, summary_sentence

    try:
        if not args.run:
            raise ValueError("--matrix needs --run RUN_ID (the stages are that run's).")
        if args.stage is not None or args.trained or args.pass_k:
            raise ValueError("--matrix scores every stage's model on every stage's task: leave out --stage, "
                             "--trained and --pass-k.")
        from grpo_app.core.run_folder import runs_root
        from grpo_app.runs.manager import RunManager

        run = RunManager(args.runs_dir or runs_root()).get(args.run)
        m = stage_matrix(run, n=args.n, seed=args.seed, max_new_tokens=args.max_new_tokens,
                         progress=lambda text: print(f"\r{text}    ", end="", flush=True))
    except (ValueError, ModelError, MatrixError) as e:
        print(f"\nCannot compute the matrix: {e}", file=sys.stderr)
        return 2
    print()  # (stage_matrix saved it in the run's eval/ folder)
    ewc = ewc_label(m, lam="lambda").replace("EWC ", "EWC on, ", 1) if m["ewc"]["enabled"] else "EWC off"
    print(f"Stage x task matrix of run {run.id} ({ewc}); {m['n']} held-out problems per task, greedy")
    width = max(12, *(len(t["name"]) + 4 for t in m["tasks"]))
    print(f"{'model':<22}" + "".join(f"{f'task {j + 1} ' + t['name']:>{width + 14}}" for j, t in enumerate(m["tasks"])))

    def cell(c):
        text = f"{100 * c['accuracy']:.1f}% [{100 * c['ci'][0]:.0f}-{100 * c['ci'][1]:.0f}]"
        if "vs_before" in c:
            v = c["vs_before"]
            text += f" {100 * v['delta']:+.1f} p={v['p_value']:.2g}"
        return f"{text:>{width + 14}}"

    print(f"{'base':<22}" + "".join(cell(c) for c in m["base"]))
    for k, row in enumerate(m["rows"]):
        print(f"{f'after stage {k + 1} ' + m['stages'][k]:<22}"[:22].ljust(22) + "".join(cell(c) for c in row))
    print("(each cell: accuracy [95% interval], change against the row above and its exact McNemar p)")
    for t in m["tasks"]:
        print(f"task {t['stage'] + 1}: {t['origin']}{floor_clause(t)}")
    print(summary_sentence(m))
    return 0


def _finish(run, status: str) -> int:
    st = run.read_status()
    print(f"Run {run.id}: {status}" + (f" ({st.get('error')})" if st.get("error") else ""))
    if status == "completed":
        print(f"Trained model: {run.final_dir}")
    if status == "stopped":
        if run.latest_checkpoint() is not None:
            print(f"Resume with: python -m grpo_app resume {run.id}")
        else:
            print("Nothing to resume: it stopped before its first step completed. Start it again.")
    peak = st.get("peak_rss_mb")
    if peak:
        print(f"Peak RSS: {peak:.0f} MB")
    return 0 if status in ("completed", "stopped") else 1


def cmd_resume(args) -> int:
    from grpo_app.runs.manager import RunManager

    try:
        manager = RunManager(_runs_dir(args.runs_dir))
        run = manager.resume(args.run_id)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"Cannot resume: {e}", file=sys.stderr)
        return 2
    print(f"Resuming {run.id}")
    return _finish(run, _watch(manager, run))


def cmd_eval(args) -> int:
    from grpo_app.core.config import DataConfig
    from grpo_app.core.models import ModelError
    from grpo_app.evaluation.scoring import EvalSettings, eval_problems, evaluate, load_for_eval

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
        from grpo_app.core.fileio import atomic_write_json

        atomic_write_json(out, {"model": spec.label, "settings": settings.__dict__, "origin": origin, **res})
        print(f"Saved {out}")
    return 0


def cmd_compare(args) -> int:
    from grpo_app.core.models import ModelError
    from grpo_app.evaluation.scoring import CompareSpec, headline, run_compare

    if args.matrix:
        return _compare_matrix(args)
    try:
        if args.run:
            from grpo_app.core.run_folder import runs_root
            from grpo_app.runs.manager import RunManager

            run = RunManager(args.runs_dir or runs_root()).get(args.run)
            if not run.has_final_model():
                raise ValueError(f"run '{run.id}' has no trained model yet (a run saves one when it completes).")
            eval_set = "gsm8k" if args.stage is None else f"stage:{args.stage - 1}"
            spec = CompareSpec.for_run(run, eval_set, args.n, args.seed, args.max_new_tokens)
        else:
            if args.stage is not None:
                raise ValueError("--stage needs --run (held-out problems leave out what that run trained on).")
            if not args.trained:
                raise ValueError("name the models: --trained MODEL [--base MODEL], or --run RUN_ID.")
            spec = CompareSpec.for_models(
                _resolve_model_arg(args.base),
                _resolve_model_arg(args.trained),
                args.n,
                args.seed,
                args.max_new_tokens or 256,
                source=args.source,
                int8=args.int8,
            )
        if args.pass_k:
            spec.with_pass_k(args.pass_k, args.temperature)
        shown: dict = {}

        def report(**fields):  # one line of progress, rewritten in place
            shown.update(fields)
            done = [f"{r} {shown[f'{r}_done']}/{shown[f'{r}_total']}" for r in ("base", "trained") if f"{r}_done" in shown]
            print(f"\r{shown.get('phase', '')}: {', '.join(done)}    ", end="", flush=True)

        res = run_compare(spec, report)
    except (ValueError, ModelError) as e:
        print(f"Cannot compare: {e}", file=sys.stderr)
        return 2
    print()
    h = headline(res)
    print(f"{spec.label()}")
    reused = "" if res.get("cached") or not res.get("reused") else f" ({' and '.join(res['reused'])} answers reused)"
    print(f"{res['origin']}, n={h['n']}{' (cached)' if res.get('cached') else ''}{reused}")
    ov = res.get("overlap_with_training")
    if ov:
        commuted = f" ({ov['commuted']} with their terms in another order)" if ov.get("commuted") else ""
        print(f"checked: {ov['in_training']} of these {ov['n']} problems were trained on{commuted} "
              f"(against {ov.get('checked_against') or 'the training pools'})")
    if res.get("not_held_out"):
        print(f"not held out: {res['not_held_out']}")
    print(f"base     {_fmt_pct(h['base_accuracy'], h['base_ci'])}   format {_fmt_pct(h['base_format'])}")
    print(f"trained  {_fmt_pct(h['trained_accuracy'], h['trained_ci'])}   format {_fmt_pct(h['trained_format'])}")
    p = res["paired"]
    print(
        f"paired: only base right {p['only_base']}, only trained right {p['only_trained']}, "
        f"exact McNemar p = {p['p_value']:.4g}"
    )
    from grpo_app.evaluation.scoring import pass_k_rows

    rows = pass_k_rows(res)
    if rows:
        pk = res["base"]["pass_k"]
        print(
            f"pass@k: {pk['k']} answers per problem sampled at temperature {pk['temperature']:g}; "
            "95% bootstrap intervals over problems"
        )
        print(f"{'k':>4}  {'base':<24} trained")
        for k, b, bci, t, tci in rows:
            print(f"{k:>4}  {_fmt_pct(b, bci):<24} {_fmt_pct(t, tci)}")
    if spec.run is not None:
        print(f"Saved in run {spec.run.id}: eval/{spec.name}.json (+ .csv)")
    return 0


def cmd_runs(args) -> int:
    from grpo_app.core.run_folder import list_runs

    if args.action == "compare":
        return cmd_runs_compare(args)
    if args.ids:
        print(f"'runs' lists every run; to put runs side by side: runs compare {' '.join(args.ids[:8])}",
              file=sys.stderr)
        return 2
    try:
        runs = list_runs(_runs_dir(args.runs_dir))
    except (ValueError, OSError) as e:
        print(f"Cannot list runs: {e}", file=sys.stderr)
        return 2
    if not runs:
        print("No runs yet.")
        return 0
    for r in runs:
        s = r.summary()
        rew = f"{s['final_reward']:.3f}" if isinstance(s["final_reward"], (int, float)) else "-"
        dur = f"{s['duration_s'] / 60:.1f} min" if s["duration_s"] else "-"
        line = f"{s['run_id']:<40} {s['status']:<12} {s['preset']:<12} steps {s['steps']:<9} reward {rew:<7} {dur}"
        print(line + (f"  ({_cut(s['damage'], 200)})" if s.get("damage") else ""))
    return 0


def cmd_runs_compare(args) -> int:
    """Runs side by side (issue 44): the settings in which they differ and a leaderboard of their Compare
    results on the same problems; --score N first scores the runs missing from GSM8K test (N problems)."""
    from grpo_app.core.run_folder import resolve_run
    from grpo_app.runs.side_by_side import (
        SideBySideError,
        check_runs,
        common_sets,
        gsm8k_set,
        leaderboard,
        score_missing,
        settings_diff,
    )

    try:
        root = _runs_dir(args.runs_dir)
        runs = check_runs([resolve_run(root, rid) for rid in args.ids])
    except (ValueError, OSError, SideBySideError) as e:
        print(f"Cannot put these runs side by side: {e}", file=sys.stderr)
        return 2
    if args.score:
        if not 1 <= args.score <= 5000:
            print("--score takes a number of problems from 1 to 5000.", file=sys.stderr)
            return 2

        def report(**f):
            if f.get("phase"):
                print(f"  {_cut(f['phase'], 160)}", file=sys.stderr, flush=True)

        try:
            scored = score_missing(runs, args.score, args.seed, report)
        except Exception as e:  # noqa: BLE001 - one clear line, never a traceback
            print(f"Scoring failed: {_cut(e, 300)}", file=sys.stderr)
            return 1
        print(f"Scored {len(scored)} run(s) on {gsm8k_set(args.score, args.seed)}.", file=sys.stderr)
        args.set = args.set or gsm8k_set(args.score, args.seed)
    sets = common_sets(runs)
    set_name = args.set or (sets[0][0] if sets else gsm8k_set(100, args.seed))
    diff = settings_diff(runs)
    board = leaderboard(runs, set_name)
    if args.json:
        print(json.dumps({"runs": [r.id for r in runs], "diff": diff, "sets": sets, "leaderboard": board}, indent=1))
        return 0
    ids = [r.id for r in runs]
    print("Settings in which they differ" + ("" if diff else ": none"))
    width = max([len(row["setting"]) for row in diff] + [7])
    for i, rid in enumerate(ids):
        print(f"  [{i + 1}] {rid}")
    for row in diff:
        print(f"  {row['setting']:<{width}}  " + "  ".join(f"[{i + 1}] {_cut(row[r], 40)}" for i, r in enumerate(ids)))
    print(f"\nLeaderboard on {set_name} (greedy; p: exact McNemar, paired by problem)")
    if not board["rows"]:
        print("  no run has a result on it; score them with --score N (or pick another set with --set).")
    for i, r in enumerate(board["rows"]):
        lo, hi = r["ci"]
        vs_best = "best" if i == 0 else f"p vs best {r['p_vs_best']:.3g}"
        print(f"  {i + 1}. {r['run']:<40} {100 * r['accuracy']:5.1f}% [{100 * lo:.1f}-{100 * hi:.1f}]  "
              f"base {100 * r['base_accuracy']:.1f}%  n {r['n']}  {vs_best}")
    if board["missing"]:
        print(f"  not scored on it: {', '.join(board['missing'])} (--score N scores them on GSM8K test)")
    if board["apart"]:
        print(f"  scored on other problems under that name, not ranked: {', '.join(board['apart'])}")
    if len(sets) > 1:
        print("  other problem sets: " + ", ".join(f"{s} ({k} runs)" for s, k in sets if s != set_name))
    return 0


def _one_line(text: str, full: bool, width: int = 150) -> str:
    if full:
        return "\n      ".join(str(text).splitlines() or [""])
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _print_group(entry: dict, full: bool, what: dict | None = None) -> None:
    from grpo_app.runs.step_history import correct_count, forced_span

    g = entry["group"]
    right = correct_count(g)
    print(
        f"step {entry.get('step')} (stage {int(entry.get('stage', 0)) + 1} {entry.get('stage_name', '')}): "
        f"mean total {g.get('mean', 0):.3f}, std {g.get('std', 0):.3f}"
        + (f", correct {right}/{len(g.get('completions') or [])}" if right is not None else "")
    )
    if what is not None:
        print(
            f"  what if total = {' + '.join(f'{w:g} x {k}' for k, w in what['weights'].items())}, first "
            f"{what['group_size']}: mean total {what['mean']:.3f}, std {what['std']:.3f}"
        )
    rows = zip(g.get("completions") or [], g.get("totals") or [], g.get("advantages") or [])
    hinted = 0
    for i, (comp, total, adv) in enumerate(rows):
        extra = ""
        if what is not None and i < what["group_size"]:
            extra = f"  what-if total {what['totals'][i]:5.2f} adv {what['advantages'][i]:+.2f}"
        elif what is not None:
            extra = "  (left out)" + " " * 25
        span = forced_span(g, i)
        if span is not None:  # trainer.py, departure 8: the hint is shown between ✎[ and ]
            hinted += 1
            comp = f"{comp[: span[0]]}✎[{comp[span[0]: span[1]]}]{comp[span[1]:]}"
        print(f"  {i + 1:>2}. total {total:5.2f}  adv {adv:+.2f}{extra} | {'✎ ' if span else ''}{_one_line(comp, full)}")
    if hinted:
        print(f"  ✎ {hinted} completion(s) ended without an answer line and got the hint ✎[\\n####] written in place "
              "of the end token (grpo.force_answer_line); the model wrote the number itself.")


def _parse_weights(text: str, known: list[str]) -> dict[str, float]:
    """'correctness=1,brevity=0.5' -> {'correctness': 1.0, 'brevity': 0.5} (ValueError says what is wrong)."""
    out = {}
    for part in [p for p in text.split(",") if p.strip()]:
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(f"'{part.strip()}': write name=weight with a reward from: {', '.join(known)}.")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"'{part.strip()}': the weight must be a number.") from None
    if not out:
        raise ValueError("give at least one name=weight.")
    return out


def cmd_answers(args) -> int:
    from grpo_app.core.run_folder import runs_root
    from grpo_app.runs.manager import RunManager
    from grpo_app.runs.step_history import find_problem, problem_history, problems, step_at

    try:
        run = RunManager(Path(args.runs_dir) if args.runs_dir else runs_root()).get(args.run_id)
    except ValueError as e:
        print(f"Cannot show answers: {e}", file=sys.stderr)
        return 2
    steps = run.steps()
    what_weights = None
    if args.what_if is not None or args.group_size is not None:
        if args.problem is None and args.step is None:
            print("--what-if / --group-size recompute shown groups: add --problem ID or --step N.", file=sys.stderr)
            return 2
        try:
            from grpo_app.core.rewards import REWARD_FUNCS

            known = list(dict.fromkeys([*REWARD_FUNCS, *(k for rec in steps for k in rec.get("weights") or {})]))
            what_weights = _parse_weights(args.what_if, known) if args.what_if is not None else None
        except ValueError as e:
            print(f"Cannot recompute: {e}", file=sys.stderr)
            return 2

    def show(entry):
        what = None
        if args.what_if is not None or args.group_size is not None:
            from grpo_app.training.advantages import what_if

            rec = step_at(steps, entry.get("step")) or {}
            try:
                what = what_if(
                    entry["group"],
                    what_weights or entry.get("weights") or {},
                    group_size=args.group_size,
                    scale_rewards=entry.get("scale_rewards") or "group",
                    batch_groups=rec.get("groups"),
                )
            except ValueError as e:
                print(f"  (cannot recompute this group: {e})")
        _print_group(entry, args.full, what)

    if not steps:
        print(f"Run {run.id} has no recorded steps (steps.jsonl is written from the first training step on).")
        return 0 if args.problem is None and args.step is None else 2
    probs = problems(steps)
    if args.problem is None and args.step is None:
        print(
            f"Run {run.id}: {len(steps)} steps recorded (steps {steps[0]['step']}-{steps[-1]['step']}), "
            f"{len(probs)} problems. Show one with --problem ID (or its #), one step with --step N."
        )
        print(f"{'#':>4}  {'problem':<22} {'seen':>4}  {'steps':<24} question")
        for i, p in enumerate(probs, 1):
            where = ", ".join(str(s) for s in p["steps"])
            where = where if len(where) <= 24 else where[:23] + "…"
            question = _one_line(p["question"], False, 70)
            print(f"{i:>4}  {p['key'][:22]:<22} {len(p['steps']):>4}  {where:<24} {question}")
        return 0
    if args.problem is not None:
        p = find_problem(steps, args.problem)
        if p is None:
            print(
                f"Run {run.id} has no problem '{args.problem}'; run `answers {run.id}` to list them "
                f"(an id like {probs[0]['key']!r} or a # from 1 to {len(probs)}).",
                file=sys.stderr,
            )
            return 2
        hist = problem_history(steps, p["key"])
        if args.step is not None:
            hist = [h for h in hist if h.get("step") == args.step]
            if not hist:
                where = ", ".join(str(s) for s in p["steps"])
                print(f"Problem {p['key']} was not sampled at step {args.step} (only at {where}).", file=sys.stderr)
                return 2
        print(f"Problem {p['key']} (gold answer {p['answer']}), sampled {len(p['steps'])} times: {p['question']}")
        for h in hist:
            show(h)
        return 0
    rec = step_at(steps, args.step)
    if rec is None:
        print(
            f"Run {run.id} has no recorded step {args.step} (recorded: {steps[0]['step']}-{steps[-1]['step']}, "
            f"{len(steps)} steps; older ones may have been thinned to bound the file).",
            file=sys.stderr,
        )
        return 2
    for g in rec["groups"]:
        question = _one_line(g.get("question", ""), False, 100)
        print(f"-- {g.get('problem_id') or ''} (gold answer {g.get('answer')}): {question}")
        show({**rec, "group": g})
    return 0


def cmd_validate(args) -> int:
    from grpo_app.core.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.set or [])
    except ConfigError as e:
        _print_config_error(e)
        return 2
    print(f"OK: preset '{cfg.preset}', {len(cfg.stages)} stages, {cfg.total_steps} steps")
    if args.show:
        print(cfg.to_yaml())
    return 0


def cmd_explain(args) -> int:
    from grpo_app.core.config import ConfigError, describe_fields, list_presets, load_config
    from grpo_app.core.rewards import reward_help

    what = args.what
    if what == "rewards":
        for name, text in reward_help().items():
            print(f"{name:<14} {text}")
    elif what == "presets":
        for name in list_presets():
            try:
                cfg = load_config(name, validate=False)
            except ConfigError as e:
                print(f"{name:<12} cannot be read: {_cut(e.errors[0][1], 200)}")
                continue
            print(f"{name:<12} {cfg.total_steps:>4} steps  {cfg.description}")
    else:
        for path, text, default in describe_fields():
            print(f"{path}  (default: {json.dumps(default)})\n    {text}")
    return 0


def cmd_export(args) -> int:
    """The run's trained model as GGUF or safetensors (a folder with a model card), optionally pushed to the Hub."""
    from grpo_app.core.run_folder import resolve_run, runs_root
    from grpo_app.export.model_files import ExportError, check_choice, export_run, push_to_hub, write_single_gguf

    try:
        fmt = str(args.format).lower()
        default_quant = {"gguf": "f16", "safetensors": "f32"}.get(fmt, "")
        fmt, quant = check_choice(fmt, args.quant or default_quant)
        root = Path(args.runs_dir) if args.runs_dir else runs_root()
        run = resolve_run(root, args.run_id)  # the one rule for run ids: a symlinked run folder is refused
        if not run.config_path.is_file():
            raise ExportError(f"there is no run '{run.id}' in {root}.")
        if args.out and args.out.endswith(".gguf"):
            if fmt != "gguf":
                raise ExportError("an --out name ending in .gguf needs --format gguf.")
            if args.push:
                raise ExportError("--push uploads a folder with its model card: give --out a folder, not a .gguf file.")
            notes = write_single_gguf(run, Path(args.out), quant)
            size = Path(args.out).stat().st_size / 2**20
            print(f"Exported {run.id} as GGUF {quant}: {args.out} ({size:,.1f} MB)")
        else:
            res = export_run(run, fmt, quant, Path(args.out) if args.out else None)
            notes = res.notes
            print(f"Exported {run.id} as {fmt} {quant}: {res.path} ({res.bytes / 2**20:,.1f} MB, model card README.md)")
        for n in notes:
            print(f"note: {n}")
        if args.push:
            url = push_to_hub(res.folder, args.push, private=not args.public, shown=str(res.folder))
            print(f"Pushed to {url}")
    except (ExportError, ValueError) as e:
        print(f"Cannot export: {e}" if "Not pushed" not in str(e) else str(e), file=sys.stderr)
        return 2
    except OSError as e:  # the target cannot be written: a path under a file, no permission, a full disk
        print(f"Cannot export: could not write {args.out or 'the export'}: {_os_reason(e)}", file=sys.stderr)
        return 2
    return 0


def _os_reason(e: OSError) -> str:
    """An OSError in a few words ('disk full', 'permission denied'), without the paths Python puts in it."""
    import errno

    words = {errno.ENOSPC: "disk full", errno.EACCES: "permission denied", errno.EPERM: "not permitted",
             errno.ENOTDIR: "a part of the path is a file, not a folder",
             errno.EEXIST: "a part of the path is a file, not a folder", errno.EROFS: "read-only file system",
             errno.EDQUOT: "disk quota exceeded", errno.ENOENT: "no such folder"}
    return words.get(e.errno, e.strerror or type(e).__name__)


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
            e.add_argument("--trained", help="run id, hub id or folder")
            e.add_argument("--run", help="a run id: its trained model vs its base model (instead of --base/--trained)")
            e.add_argument(
                "--stage",
                type=int,
                help="with --run: held-out problems like the run's stage K (1 = first); none it trained on",
            )
            e.add_argument("--matrix", action="store_true",
                           help="with --run: the stage x task matrix, each stage's model on every stage's held-out task")
            e.add_argument("--runs-dir", default=None)
            e.add_argument("--pass-k", type=int, default=0, help="sample K answers per problem: pass@1..K (0: off)")
            e.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for --pass-k")
        e.add_argument("--n", type=int, default=100)
        e.add_argument("--seed", type=int, default=0)
        e.add_argument(
            "--max-new-tokens", type=int, default=None if name == "compare" else 256, help="answer budget (default 256)"
        )
        e.add_argument("--source", default="gsm8k", help="gsm8k, arithmetic, word or gsm_symbolic")
        e.add_argument("--int8", action="store_true", help="dynamic INT8 quantization of Linear layers")
        e.set_defaults(func=fn)

    ls = sub.add_parser("runs", help="list runs, or put 2-8 runs side by side: runs compare ID ID ...")
    ls.add_argument("action", nargs="?", choices=["compare"], help="compare: the settings that differ and a "
                    "leaderboard of the runs' Compare results on the same problems")
    ls.add_argument("ids", nargs="*", help="run ids (with compare)")
    ls.add_argument("--set", default="", help="compare: the problem set to rank on (a result name of the runs' "
                    "eval/ folders, e.g. gsm8k-n100-seed0-d0-99; default: the one most runs share)")
    ls.add_argument("--score", type=int, default=0, metavar="N",
                    help="compare: first score the runs missing from GSM8K test on N problems")
    ls.add_argument("--seed", type=int, default=0, help="compare --score: the problems' seed (default 0)")
    ls.add_argument("--json", action="store_true", help="compare: print JSON")
    ls.add_argument("--runs-dir", default=None)
    ls.set_defaults(func=cmd_runs)

    ex = sub.add_parser("export", help="a run's trained model as GGUF (llama.cpp, Ollama) or safetensors")
    ex.add_argument("run_id")
    ex.add_argument("--format", "-f", default="gguf", help="gguf or safetensors (default: gguf)")
    ex.add_argument("--quant", "-q", default=None, help="f32, f16 or q8_0 (gguf only); default f16 for gguf, f32 else")
    ex.add_argument("--out", "-o", default=None, help="a folder (default: <run>/export/<format>-<quant>) or a .gguf file")
    ex.add_argument("--push", metavar="OWNER/NAME", default=None, help="then upload the folder to this Hub model repo")
    ex.add_argument("--public", action="store_true", help="with --push: make a new repo public (default private)")
    ex.add_argument("--runs-dir", default=None)
    ex.set_defaults(func=cmd_export)

    a = sub.add_parser("answers", help="a run's sampled answers across training: problems, one problem, one step")
    a.add_argument("run_id")
    a.add_argument("--problem", "-p", help="problem id (or its # in the list) to follow across steps")
    a.add_argument("--step", type=int, help="only this step")
    a.add_argument("--full", action="store_true", help="whole completions (default: one line each)")
    a.add_argument(
        "--what-if",
        metavar="NAME=W,...",
        help="recompute each shown group's totals and advantages with these reward weights (nothing is trained); "
        "rewards the run did not use are scored from the stored text",
    )
    a.add_argument("--group-size", type=int, help="with the what-if: keep only the first n completions of each group")
    a.add_argument("--runs-dir", default=None)
    a.set_defaults(func=cmd_answers)

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
    processes receive the folder from it and train their replica there (see grpo_app/core/distributed.py)."""
    from grpo_app.core import distributed
    from grpo_app.core.config import ConfigError, load_config
    from grpo_app.core.models import pick_device

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
                _print_config_error(e)
            return 2
        device = pick_device(cfg.model.device)
    else:
        device = "auto"
    distributed.init(device)
    try:
        return _lead_the_processes(args, cfg, resume) if main else _train_a_replica(resume)
    finally:
        distributed.shutdown()  # every process leaves the group before it exits (see distributed.shutdown)


def _train_a_replica(resume: bool) -> int:
    """A process other than rank 0: train a replica in the run folder rank 0 sends (None: it said why not)."""
    import signal
    import traceback

    from grpo_app.core import distributed
    from grpo_app.core.run_folder import RunDir
    from grpo_app.training.engine import train

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


def _lead_the_processes(args, cfg, resume: bool) -> int:
    """Rank 0: create (or reopen) the run, send its folder to the other processes, train and show progress."""
    from grpo_app.core import distributed
    from grpo_app.core.run_folder import runs_root
    from grpo_app.runs.manager import RunManager

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
    status = _watch(manager, run, second_interrupt_aborts=False)
    manager.wait(60)  # the training thread writes the run's last status and then ends: let it, before leaving the group
    return _finish(run, status)


def _launched_processes() -> int:
    """WORLD_SIZE set by `torchrun` / `accelerate launch` (1 otherwise); read without importing torch."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def main(argv: list[str] | None = None) -> int:
    from grpo_app.core.system import quiet_libraries

    args = build_parser().parse_args(argv)
    if _launched_processes() > 1 and args.func in (cmd_train, cmd_resume):
        quiet_libraries()
        return _train_in_processes(args)
    quiet_libraries()
    return args.func(args)
