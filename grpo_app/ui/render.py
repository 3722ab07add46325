"""HTML for the pages: status line, the inside of a GRPO step, comparison cards, answers, system.

Pure functions of plain data (no Gradio import), so they are unit-tested like the charts. Every
piece of text that came from a model, a dataset or a user is escaped.
"""

from __future__ import annotations

import datetime as _dt
import math
from html import escape

from grpo_app.runs.monitor import fmt_duration
from grpo_app.runs.step_history import correct_count, forced_span

STATE_COLORS = {
    "running": "#0072B2",
    "stopping": "#E69F00",
    "created": "#0072B2",
    "stopped": "#E69F00",
    "interrupted": "#E69F00",
    "completed": "#009E73",
    "failed": "#D55E00",
    "idle": "#777777",
}


def _e(x) -> str:
    return escape(str(x), quote=True)


def _pct(x, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}%"


def _fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}"


def errors_html(errors, lead: str) -> str:
    """A refusal on a page: `lead` (e.g. 'Nothing was started:') and one line per (field, message)."""
    items = "".join(f"<li>{_e(m)}</li>" for _, m in errors)
    return f'<div class="job job-bad">{_e(lead)}<ul>{items}</ul></div>'


def badge(state: str, text: str | None = None) -> str:
    color = STATE_COLORS.get(state, "#555")
    return f'<span class="badge" style="background:{color}">{_e(text or state)}</span>'


# ------------------------------------------------------------------------------------------------
# Train tab
# ------------------------------------------------------------------------------------------------
def status_html(p: dict, note: str = "") -> str:
    """One line a projector can show: run id, state, stage k/n, step, elapsed, ETA, tokens/s."""
    if not p.get("run_id"):
        return (
            '<div class="status-line" id="status-line">'
            + badge("idle", "no run yet")
            + " <span>Pick a preset and click <b>Start training</b>.</span></div>"
        )
    parts = [badge(p["state"], p.get("state_text") or p["state"]), f'<span class="run-id">{_e(p["run_id"])}</span>']
    if p.get("stage"):
        parts.append(
            f"<span>stage <b>{p['stage']}/{p.get('n_stages') or '?'}</b> {_e(p.get('stage_name') or '')}</span>"
        )
    parts.append(f"<span>step <b>{p.get('step', 0)}/{p.get('total_steps') or '?'}</b></span>")
    parts.append(f"<span>elapsed <b>{fmt_duration(p.get('elapsed_s'))}</b></span>")
    if p.get("state") in ("running", "stopping"):
        parts.append(f"<span>ETA <b>{fmt_duration(p.get('eta_s'))}</b></span>")
    if p.get("tokens_per_s"):
        parts.append(f"<span><b>{p['tokens_per_s']:.0f}</b> tokens/s</span>")
    if p.get("state") in ("running", "stopping") and p.get("phase"):
        parts.append(f'<span class="phase">{_e(p["phase"])}</span>')
    html = '<div class="status-line" id="status-line">' + " · ".join(parts) + "</div>"
    if p.get("error"):
        html += f'<div class="status-error">Error: {_e(p["error"])}</div>'
    if note:
        html += f'<div class="status-note">{note}</div>'
    return html


def _adv_style(a: float) -> str:
    alpha = 0.12 + 0.7 * min(1.0, abs(a) / 2.0)
    if abs(a) < 1e-6:
        return "background:#eeeeee;color:#333"
    rgb = "0,158,115" if a > 0 else "213,94,0"
    text = "#fff" if alpha > 0.5 else "#111"
    return f"background:rgba({rgb},{alpha:.2f});color:{text}"


FORCED_TITLE = "written by the trainer in place of the end token (grpo.force_answer_line), not sampled"


def _completion_html(text: str, span: tuple[int, int] | None) -> str:
    """A completion's text, escaped, with the forced hint (if any) marked."""
    if span is None:
        return _e(text) or "<i>(empty)</i>"
    a, b = span
    return (f'<span class="forced-tag" title="{FORCED_TITLE}">✎ hint</span> {_e(text[:a])}'
            f'<mark class="forced" title="{FORCED_TITLE}">{_e(text[a:b])}</mark>{_e(text[b:])}')


def forced_note(step: dict, groups: list[dict]) -> str:
    """One sentence under a step's table when the trainer wrote hints into any of its completions."""
    n = sum(1 for g in groups for i in range(len(g.get("completions") or [])) if forced_span(g, i))
    if not n:
        return ""
    how = ("left out of the loss (grpo.force_answer_line_loss: mask): the model learns only from the tokens it "
           "sampled" if step.get("forced_loss") == "mask" else "trained on like the model's own tokens")
    return (f" ✎ marks a completion that ended without its answer line and was given the hint “\n####” in place of "
            f"its end token (the model then wrote the number itself); the hint is {how}. Scoring never forces.")


def step_html(step: dict | None, group: int = 0) -> str:
    """The classroom view of one GRPO step: a prompt, its G completions, every reward, the total,
    the group's mean and std, and each completion's advantage (green: pushed up, red: pushed down)."""
    if not step or not step.get("groups"):
        return (
            '<div class="gs gs-empty">When training runs, the latest step appears here: the prompt, the G sampled '
            "completions, what each reward function paid them, and the advantage GRPO gives each one.</div>"
        )
    groups = step["groups"]
    group = max(0, min(int(group or 0), len(groups) - 1))
    g = groups[group]
    weights = step.get("weights") or {}
    names = list(g.get("rewards", {}).keys())
    n = len(g.get("completions", []))
    head = (
        f'<div class="gs-head">Step <b>{_e(step.get("step", "?"))}</b> · stage {int(step.get("stage", 0)) + 1} '
        f"<i>{_e(step.get('stage_name', ''))}</i> · prompt {group + 1} of {len(groups)} · G = {n} completions</div>"
    )
    q = (
        f'<div class="gs-q"><div><b>Question.</b> {_e(g.get("question", ""))}</div>'
        f'<div class="gs-gold">Gold answer: <b>{_e(g.get("answer", ""))}</b></div></div>'
    )
    ths = "".join(
        f'<th title="weight {_fmt(weights.get(k), 2)}">{_e(k)}<br><small>× {_fmt(weights.get(k), 2)}</small></th>'
        for k in names
    )
    rows = []
    for i in range(n):
        comp = g["completions"][i]
        cells = "".join(f'<td class="num">{_fmt(g["rewards"][k][i], 2)}</td>' for k in names)
        adv = float(g["advantages"][i]) if i < len(g.get("advantages", [])) else 0.0
        rows.append(
            f'<tr><td class="num">{i + 1}</td><td class="comp"><div class="comp-text">'
            f"{_completion_html(comp, forced_span(g, i))}</div></td>"
            f'{cells}<td class="num total">{_fmt(g["totals"][i], 2)}</td>'
            f'<td class="num adv" style="{_adv_style(adv)}">{adv:+.2f}</td></tr>'
        )
    mean, std = g.get("mean", 0.0), g.get("std", 0.0)
    foot = (
        f'<tr class="gs-foot"><td></td><td>group mean <b>{_fmt(mean, 3)}</b> · std <b>{_fmt(std, 3)}</b></td>'
        f'<td colspan="{len(names)}"></td><td class="num">{_fmt(mean, 2)}</td><td></td></tr>'
    )
    hinted = forced_note(step, [g])
    table = (
        '<table class="gs-table"><thead><tr><th>#</th>'
        f"<th>Completion ({'sampled; ✎ = a hint written in' if hinted else 'sampled'})</th>"
        f"{ths}<th>Total</th><th>Advantage</th></tr></thead><tbody>{''.join(rows)}{foot}</tbody></table>"
    )
    if std is not None and std < 1e-9:
        note = (
            "All G completions got the same total, so every advantage is 0: this group gives no learning "
            "signal (its backward pass is skipped)."
        )
    else:
        note = (
            "Advantage ≈ (total − group mean) / group std. Green completions are made more likely, red ones "
            "less likely; the further from 0, the stronger the push. The model is only compared with itself."
        )
    return f'<div class="gs">{head}{q}{table}<div class="gs-note">{note}{hinted}</div></div>'


def group_choices(step: dict | None) -> list[tuple[str, int]]:
    groups = (step or {}).get("groups") or []
    out = []
    for i, g in enumerate(groups):
        q = str(g.get("question", ""))
        out.append((f"{i + 1}: {q[:40]}{'…' if len(q) > 40 else ''}", i))
    return out


def stamp_what_if(html: str, version: int) -> str:
    """A What-if table marked with the version of the page's choices it was computed from (ui/choices.py), so the
    page can tell a late draw's table from a newer one it already shows (ui/live.py, DRAW_JS)."""
    return f'<div class="wi-v" data-wiv="{int(version)}">{html}</div>'


def what_if_html(step: dict | None, group: int, result: dict | None, error: str = "") -> str:
    """The what-if view of one prompt (an `advantages.what_if` result): each completion's rewards, its new
    total, and its recorded and what-if advantage side by side, with the new group mean and std."""
    if error:
        return f'<div class="gs gs-empty wi-error">⚠ {_e(error)}</div>'
    if not step or not step.get("groups") or not result:
        return '<div class="gs gs-empty">When a step has been recorded, change the weights here to recompute it.</div>'
    groups = step["groups"]
    group = max(0, min(int(group or 0), len(groups) - 1))
    recorded = groups[group]
    weights = result["weights"]
    names = list(result["rewards"])
    total_text = " + ".join(f"{w:g} × {_e(k)}" for k, w in weights.items()) or "nothing"
    g_all = len(recorded.get("completions") or [])
    scale = {
        "group": "divided by the group's std (+ 1e-4)",
        "batch": "divided by the std of the whole step (+ 1e-4)",
        "none": "not divided (scale_rewards = none)",
    }.get(result["scale_rewards"], _e(result["scale_rewards"]))
    computed = (
        f" Scored now from the text (the run did not use them): {', '.join(_e(c) for c in result['computed'])}."
        if result.get("computed")
        else ""
    )
    head = (
        f'<div class="wi-head">Prompt {group + 1} of step {_e(step.get("step", "?"))}: total = {total_text}; the first '
        f"<b>{result['group_size']}</b> of {g_all} completions; advantage = total − group mean, {scale}. "
        f"Nothing is trained.{computed}</div>"
    )
    ths = "".join(f"<th>{_e(k)}<br><small>× {_fmt(weights.get(k), 2)}</small></th>" for k in names)
    rows = []
    rec_adv = recorded.get("advantages") or []
    for i, comp in enumerate(result["completions"]):
        flat = " ".join(str(comp).split())
        short = flat if len(flat) <= 70 else flat[:69] + "…"
        ra = float(rec_adv[i]) if i < len(rec_adv) else 0.0
        wa = float(result["advantages"][i])
        cells = "".join(f'<td class="num">{_fmt(result["rewards"][k][i], 2)}</td>' for k in names)
        tag = f'<span class="forced-tag" title="{FORCED_TITLE}">✎</span> ' if forced_span(recorded, i) else ""
        rows.append(
            f'<tr><td class="num">{i + 1}</td><td class="comp"><div class="wi-comp">{tag}{_e(short) or "<i>(empty)</i>"}'
            f'</div></td>{cells}<td class="num total">{_fmt(result["totals"][i], 2)}</td>'
            f'<td class="num adv" style="{_adv_style(ra)}">{ra:+.2f}</td>'
            f'<td class="num adv wi-adv" style="{_adv_style(wa)}">{wa:+.2f}</td></tr>'
        )
    foot = (
        f'<tr class="gs-foot"><td></td><td>what-if group mean <b>{_fmt(result["mean"], 3)}</b> · std '
        f"<b>{_fmt(result['std'], 3)}</b> (recorded: {_fmt(recorded.get('mean'), 3)} · {_fmt(recorded.get('std'), 3)})"
        f'</td><td colspan="{len(names) + 3}"></td></tr>'
    )
    table = (
        '<table class="gs-table wi-table"><thead><tr><th>#</th><th>Completion (start)</th>'
        f"{ths}<th>Total</th><th>Recorded advantage</th><th>What-if advantage</th></tr></thead>"
        f"<tbody>{''.join(rows)}{foot}</tbody></table>"
    )
    hinted = forced_note(step, [recorded])
    return (f'<div class="wi">{head}{table}{scalings_html(result)}'
            + (f'<div class="gs-note">{hinted.strip()}</div>' if hinted else "") + "</div>")


SCALINGS = {  # TRL's scale_rewards, what it does, and where it comes from
    "group": "÷ the group's std: GRPO as published (TRL's default)",
    "batch": "÷ the std of the whole step: PPO Lite",
    "none": "not divided: Dr. GRPO (no bias towards groups whose rewards barely differ)",
}


def scalings_html(result: dict) -> str:
    """The what-if advantages under each of TRL's `scale_rewards` (the run's marked): what Dr. GRPO changes."""
    by = result.get("by_scale") or {}
    if not by:
        return ""
    n = len(result.get("completions") or [])
    head = "".join(f"<th>{i + 1}</th>" for i in range(n))
    rows = []
    for s, what in SCALINGS.items():
        adv = by.get(s) or []
        mark = " <b>(this run)</b>" if s == result.get("scale_rewards") else ""
        cells = "".join(f'<td class="num adv" style="{_adv_style(float(a))}">{float(a):+.2f}</td>' for a in adv)
        rows.append(f'<tr><td class="comp">{_e(s)}: {_e(what)}{mark}</td>{cells}</tr>')
    return ('<table class="gs-table wi-scalings"><thead><tr><th>Advantage of completion … with scale_rewards =</th>'
            f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def answers_problem_html(history: list[dict], pos: int) -> str:
    """One problem across training: a line per time it was sampled (step, mean total, right answers), then
    the group at position `pos` (1-based) drawn like the step view."""
    if not history:
        return '<div class="gs gs-empty">This problem was not sampled in the recorded steps.</div>'
    pos = max(1, min(int(pos or 1), len(history)))
    g0 = history[0]["group"]
    lines = []
    for i, h in enumerate(history, 1):
        g = h["group"]
        right = _right(g)
        cls = ' class="ans-now"' if i == pos else ""
        lines.append(
            f'<tr{cls}><td class="num">{i}</td><td class="num">{_e(h.get("step"))}</td>'
            f"<td>{int(h.get('stage', 0)) + 1}: {_e(h.get('stage_name', ''))}</td>"
            f'<td class="num">{_fmt(g.get("mean"), 2)}</td><td class="num">{_fmt(g.get("std"), 2)}</td>'
            f'<td class="num">{right}</td></tr>'
        )
    trend = (
        f'<div class="ans-head">Problem <b>{_e(g0.get("problem_id") or "")}</b> was sampled <b>{len(history)}</b> '
        f"times. Showing time <b>{pos}</b> (step {_e(history[pos - 1].get('step'))}).</div>"
        '<table class="gs-table ans-trend"><thead><tr><th>Time</th><th>Step</th><th>Stage</th><th>Mean total</th>'
        f"<th>Std</th><th>Right answers</th></tr></thead><tbody>{''.join(lines)}</tbody></table>"
    )
    h = history[pos - 1]
    step = {**{k: v for k, v in h.items() if k != "group"}, "groups": [h["group"]]}
    return f'<div class="ans">{trend}{step_html(step, 0)}</div>'


def answers_step_html(record: dict | None, pos: int, n_steps: int) -> str:
    """Every group of one recorded step (position `pos` of `n_steps` recorded), each drawn like the step view."""
    if not record:
        return '<div class="gs gs-empty">No step recorded here.</div>'
    head = (
        f'<div class="ans-head">Recorded step {int(pos)} of {int(n_steps)}: training step '
        f"<b>{_e(record.get('step'))}</b>, {len(record.get('groups') or [])} prompts.</div>"
    )
    groups = "".join(step_html(record, i) for i in range(len(record.get("groups") or [])))
    return f'<div class="ans">{head}{groups}</div>'


def answers_choices(problems: list[dict]) -> list[tuple[str, str]]:
    out = [("Every problem of one step (move along the steps)", "")]
    for p in problems:
        q = " ".join(str(p.get("question", "")).split())
        out.append((f"{p['key'][:28]} · sampled {len(p['steps'])}× · {q[:50]}{'…' if len(q) > 50 else ''}", p["key"]))
    return out


def _right(group: dict) -> str:
    right = correct_count(group)
    return "–" if right is None else f"{right}/{len(group.get('completions') or [])}"


def _clock(t) -> str:
    try:
        return _dt.datetime.fromtimestamp(float(t)).strftime("%H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "--:--:--"


def event_line(ev: dict) -> str | None:
    """One event of a run in plain words (None for events a class does not need to see)."""
    kind = ev.get("event")
    k = int(ev.get("stage", 0) or 0) + 1
    if kind == "model_loaded":
        device = ev.get("device", "cpu")
        if device == "cpu" and ev.get("cpu"):  # runs before 2026-11-30 did not record their CPU
            device += f" ({ev['cpu']}, {ev.get('cpu_kernels')} kernels)"
        return (
            f"model loaded: {ev.get('model')} ({(ev.get('parameters') or 0) / 1e6:.1f} M parameters, "
            f"{(ev.get('trainable') or 0) / 1e6:.1f} M trained) on {device} with {ev.get('threads')} threads"
        )
    if kind == "stage_start":
        return (
            f"stage {k} *{ev.get('name')}* started: {ev.get('problems')} problems from {ev.get('origin')}, "
            f"{ev.get('steps')} steps" + (", EWC penalty on" if ev.get("ewc") else "")
            + (f", {ev['replayed']} of them replayed from earlier stages" if ev.get("replayed") else "")
            + (f", {ev.get('device')} in {ev['precision']}" if ev.get("precision", "float32") != "float32" else "")
        )
    if kind == "stage_end":
        return f"stage {k} *{ev.get('name')}* finished at step {ev.get('step')}"
    if kind == "fisher_done":
        return f"Fisher information of stage {k} estimated from {ev.get('samples')} samples in {float(ev.get('seconds') or 0):.1f} s"
    if kind == "stopped":
        if not ev.get("checkpoint"):  # stopped before its first step ended: there is nothing to continue
            return f"stopped at step {ev.get('step')}, before any step completed: nothing to resume (Start again)"
        return f"stopped at step {ev.get('step')}; checkpoint {ev.get('checkpoint')} saved (Resume continues from it)"
    if kind == "resumed":
        skipped = ev.get("skipped") if isinstance(ev.get("skipped"), list) else []
        passed = f"; passed over damaged {'; '.join(map(str, skipped[:3]))}" if skipped else ""
        return f"resumed from step {ev.get('step')} (checkpoint {ev.get('checkpoint')}){passed}"
    if kind == "final_saved":
        return "trained model saved"
    if kind == "eval_done":
        return (
            f"evaluated on {ev.get('n')} problems: base {_pct(ev.get('base_accuracy'))}, "
            f"trained {_pct(ev.get('trained_accuracy'))}"
        )
    if kind == "finished":
        return f"finished in {fmt_duration(ev.get('seconds'))}"
    if kind == "error":
        return f"**error**: {ev.get('message')}"
    return None


def events_md(events: list[dict], limit: int = 8) -> str:
    """The latest events of a run, newest first, as a short Markdown list (markup in values escaped)."""
    lines = []
    for ev in reversed(events or []):
        text = event_line(ev)
        if text:
            lines.append(f"- `{_clock(ev.get('time'))}` {_md_safe(text)}")
        if len(lines) >= limit:
            break
    if not lines:
        return "**Run log**\n\nNothing yet: events (stages, Fisher passes, stops) appear here."
    return "**Run log** (newest first)\n\n" + "\n".join(lines)


def _md_safe(text: str) -> str:
    """Keep our own *emphasis*, neutralise HTML and links that came from names or messages."""
    return escape(text, quote=False).replace("[", "\\[").replace("]", "\\]")


# ------------------------------------------------------------------------------------------------
# Compare tab
# ------------------------------------------------------------------------------------------------
def job_progress_html(job: dict | None, position: int = 0, busy_training: bool = False) -> str:
    if not job:
        return ""
    st, prog = job["status"], job.get("progress") or {}
    if st == "queued":
        return f'<div class="job">Waiting in the queue (position {position}). One evaluation runs at a time.</div>'
    if st == "cancelled":
        return f'<div class="job job-bad">Cancelled{": " + _e(job["cancel_reason"]) if job.get("cancel_reason") else ""}.</div>'
    if st == "failed":
        return f'<div class="job job-bad">Failed: {_e(job.get("error") or "unknown error")}</div>'
    done = 0
    total = 0
    parts = []
    for role in ("base", "trained"):
        d, t = prog.get(f"{role}_done", 0), prog.get(f"{role}_total", 0)
        done, total = done + d, total + t
        if t:
            parts.append(f"{role}: {d}/{t}")
    frac = 1.0 if st == "done" else (done / total if total else 0.0)
    phase = _e(prog.get("phase", "")) if st == "running" else "finished"
    note = " · a training run shares the CPU, so this is slower" if busy_training and st == "running" else ""
    return (
        f'<div class="job"><div class="bar"><div class="fill" style="width:{100 * frac:.1f}%"></div></div>'
        f"<div>{phase}{' · ' if parts else ''}{' · '.join(parts)}{note}</div></div>"
    )


def _card(title: str, label: str, s: dict) -> str:
    lo, hi = s["ci"]
    return (
        f'<div class="card"><div class="card-title">{_e(title)}</div><div class="card-model">{_e(label)}</div>'
        f'<div class="card-big">{_pct(s["accuracy"])}</div>'
        f'<div class="card-ci">95% interval {_pct(lo)} – {_pct(hi)} · {s["correct"]}/{s["n"]} correct</div>'
        f'<div class="card-sub">format rate {_pct(s["format_rate"])} · strict (####) accuracy {_pct(s["strict_accuracy"])}</div></div>'
    )


def compare_summary_html(result: dict) -> str:
    b, t, p = result["base"]["summary"], result["trained"]["summary"], result["paired"]
    pv = p["p_value"]
    if pv < 0.05:
        verdict = "The difference is unlikely to be chance (p < 0.05)."
    else:
        verdict = "The difference could well be chance (p ≥ 0.05): more problems or more training are needed to tell."
    cached = " · loaded from cache" if result.get("cached") else ""
    reused = [r for r in result.get("reused") or [] if r in ("base", "trained")]
    if reused and not result.get("cached"):  # one model's answers came from an earlier comparison
        cached += f" · the {' and '.join(reused)} model's answers reused from an earlier comparison on these problems"
    return (
        f'<div class="cards">{_card("Base", result.get("base_label", result.get("base_model", "")), b)}'
        f"{_card('Trained', result.get('trained_label', result.get('trained_model', '')), t)}</div>"
        f'<div class="paired">Paired test on the same {p["n"]} problems: only base right <b>{p["only_base"]}</b>, '
        f"only trained right <b>{p['only_trained']}</b>, both <b>{p['both']}</b>, neither <b>{p['neither']}</b>. "
        f"Exact McNemar <b>p = {pv:.3g}</b>. {verdict}</div>"
        f'<div class="origin">{_e(result.get("origin", ""))} · seed {result.get("settings", {}).get("seed", "?")}{cached}</div>'
    )


COMPARE_HEADERS = ["#", "Difficulty", "Question", "Gold", "Base answer", "Base", "Trained answer", "Trained"]


def compare_rows(result: dict) -> list[list]:
    trained = {r["id"]: r for r in result["trained"]["records"]}
    rows = []
    for i, b in enumerate(result["base"]["records"], 1):
        t = trained.get(b["id"], {})
        rows.append(
            [
                i,
                b["difficulty"],
                b["question"],
                b["gold"],
                b.get("pred") if b.get("pred") is not None else "(none)",
                "✓" if b["correct"] else "✗",
                t.get("pred") if t.get("pred") is not None else "(none)",
                "✓" if t.get("correct") else "✗",
            ]
        )
    return rows


# ------------------------------------------------------------------------------------------------
# Try tab
# ------------------------------------------------------------------------------------------------
def answer_html(title: str, label: str, state: dict | None, final: dict | None = None) -> str:
    if state is None:
        return f'<div class="answer"><div class="answer-title">{_e(title)}</div><div class="answer-model">{_e(label)}</div></div>'
    body = _e(state.get("text", "")) or "<i>…</i>"
    meta = f"{state.get('tokens', 0)} tokens"
    if state.get("done") and state.get("seconds"):
        meta += f" in {state['seconds']:.1f} s"
        reason = {"eos": "ended", "answer": "stopped after its '####' line", "length": "hit the token limit"}.get(
            state.get("stop"), ""
        )
        if reason:
            meta += f" · {reason}"
    elif not state.get("done"):
        meta += " · generating…"
    html = (
        f'<div class="answer"><div class="answer-title">{_e(title)}</div><div class="answer-model">{_e(label)}</div>'
        f'<div class="answer-text">{body}</div><div class="answer-meta">{meta}</div>'
    )
    if state.get("error"):
        html += f'<div class="status-error">{_e(state["error"])}</div>'
    if final is not None:
        pred = final.get("pred")
        how = {"marker": "after '####'", "last_number": "last number (no '####' line)", "none": ""}.get(
            final.get("how"), ""
        )
        verdict = ""
        if final.get("correct") is True:
            verdict = ' <span class="ok">✓ correct</span>'
        elif final.get("correct") is False:
            verdict = f' <span class="bad">✗ expected {_e(final.get("gold"))}</span>'
        html += f'<div class="answer-pred">Extracted answer: <b>{_e(pred) if pred is not None else "none"}</b> <small>{how}</small>{verdict}</div>'
        rewards = final.get("rewards") or {}
        if rewards:
            cells = "".join(
                f"<tr><td>{_e(k)}</td><td class='num'>{_fmt(v, 2)}</td></tr>"
                for k, v in rewards.items()
                if k != "total"
            )
            html += (
                f'<table class="rew"><thead><tr><th>reward</th><th>score</th></tr></thead><tbody>{cells}'
                f'<tr class="total"><td>weighted total</td><td class="num">{_fmt(rewards.get("total"), 2)}</td></tr></tbody></table>'
            )
        if final.get("partial"):
            html += '<div class="answer-meta">Rewards that compare with the expected answer are left out: type it to see them.</div>'

    return html + "</div>"


# ------------------------------------------------------------------------------------------------
# Runs tab
# ------------------------------------------------------------------------------------------------
RUN_HEADERS = ["Run", "Status", "Preset", "Model", "Stages", "Steps", "Final reward", "Duration", "Started"]


def run_rows(summaries: list[dict]) -> list[list]:
    rows = []
    for s in summaries:
        started = s.get("started")
        rows.append(
            [
                s["run_id"],
                s["status"],
                s["preset"],
                s["model"],
                s["stages"],
                s["steps"],
                _fmt(s.get("final_reward"), 3) if isinstance(s.get("final_reward"), (int, float)) else "–",
                fmt_duration(s.get("duration_s")) if s.get("duration_s") else "–",
                _dt.datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M") if started else "–",
            ]
        )
    return rows


EVAL_HEADERS = ["Result", "N", "Base accuracy", "Trained accuracy", "McNemar p", "Base format", "Trained format"]


def eval_rows(results: list[tuple[str, dict]]) -> list[list]:
    rows = []
    for name, r in results:
        try:
            b, t = r["base"]["summary"], r["trained"]["summary"]
            rows.append(
                [
                    name,
                    b["n"],
                    f"{_pct(b['accuracy'])} [{_pct(b['ci'][0])}–{_pct(b['ci'][1])}]",
                    f"{_pct(t['accuracy'])} [{_pct(t['ci'][0])}–{_pct(t['ci'][1])}]",
                    f"{r['paired']['p_value']:.3g}",
                    _pct(b["format_rate"]),
                    _pct(t["format_rate"]),
                ]
            )
        except (KeyError, TypeError, IndexError, ValueError):  # a damaged result file: left out
            continue
    return rows


def run_details_md(summary: dict, events: list[dict]) -> str:
    """A run's headline and its events in plain words, oldest first."""
    lines = [
        f"### {summary['run_id']}",
        f"**Status:** {summary['status']} · **steps** {summary['steps']} · **model** `{summary['model']}`",
    ]
    if summary.get("duration_s"):
        lines[-1] += f" · **duration** {fmt_duration(summary['duration_s'])}"
    if summary.get("error"):
        lines.append(f"**Error:** {_md_safe(str(summary['error']))}")
    for ev in events:
        text = event_line(ev)
        if text:
            lines.append(f"- {_md_safe(text)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# System
# ------------------------------------------------------------------------------------------------
def system_md(info: dict, loaded: list[dict] | None = None, run_model: dict | None = None) -> str:
    c, m, v = info["cpu"], info["memory"], info["versions"]
    em = info.get("embedded_model", {})
    lines = [
        "| What | This server |",
        "|---|---|",
        f"| CPU | {c['name']}" + (f" (torch kernels: {c['kernels']})" if c.get("kernels") else "") + " |",
        f"| Cores | {c['physical_cores']} physical, {c['logical_cores']} logical"
        + (f", {c['usable_cores']} usable by this process" if c.get("usable_cores") else "")
        + " |",
        f"| Threads used by torch | {c['torch_threads']} (inter-op {c['torch_interop_threads']}) |",
        f"| Load (1 min) | {_fmt(c.get('load_1min'), 2)} |",
        f"| Memory | {m['total_mb'] / 1024:.1f} GB total, {m['available_mb'] / 1024:.1f} GB available |",
        f"| This app's memory (RSS) | {m['process_rss_mb']:,.0f} MB |",
        f"| GPU | {'yes (CUDA)' if c.get('cuda') else 'none: everything runs on the CPU'} |",
    ]
    if em:
        size = (
            f"{em['parameters'] / 1e6:.1f} M parameters, {em['f32_mb']:,.0f} MB as float32"
            if em.get("parameters")
            else "not de-quantized yet"
        )
        gguf = f"; shipped as {em['gguf_mb']:,.0f} MB Q4_1 GGUF" if em.get("gguf_mb") else ""
        lines.append(f"| Embedded model | {em.get('name', '')}: {size}{gguf} |")
    if run_model:
        lines.append(
            f"| Model of the current run | {run_model.get('model')}: {run_model.get('parameters', 0) / 1e6:.1f} M parameters, {run_model.get('trainable', 0) / 1e6:.1f} M trained |"
        )
    for lm in loaded or []:
        lines.append(f"| Loaded for Try | {lm['label']}: {lm['bytes'] / 2**20:,.0f} MB |")
    lines.append(f"| Platform | {info.get('platform', '')} |")
    lines.append("| Versions | " + ", ".join(f"{k} {val}" for k, val in v.items()) + " |")
    return "\n".join(lines)


def matrix_note_html(titled: list[tuple[str, dict]]) -> str:
    """Under the stage x task heatmaps: where each task's problems come from and what a constant answer would score on
    them (`stage_matrix.floor_clause`), and for each run its plasticity,
    backward and forward transfer in a sentence (stage_matrix.summary_sentence)."""
    from grpo_app.evaluation.stage_matrix import floor_clause, summary_sentence

    if not titled:
        return ""
    tasks = titled[0][1]["tasks"]
    origin = "".join(f"<li>task {t['stage'] + 1} ({_e(t['name'])}): {t['n']} problems, {_e(t['origin'])}"
                     f"{_e(floor_clause(t))}</li>" for t in tasks)
    runs = "".join(f"<p><b>{_e(title)}.</b> {_e(summary_sentence(m))}</p>" for title, m in titled)
    return f'<div class="matrix-note">{runs}<ul>{origin}</ul></div>'


# ---- runs side by side (issue 44) ------------------------------------------------------------------------
BOARD_HEADERS = ["#", "Run", "Trained accuracy [95% CI]", "Base accuracy", "p vs base", "p vs best", "Trained format",
                 "N"]


def diff_table(diff: list[dict], run_ids: list[str]) -> dict:
    """The settings in which the runs differ, as a Dataframe value (one column per run)."""
    if not diff:
        return {"headers": ["Setting", *run_ids], "data": [["(the runs' settings are the same)", *[""] * len(run_ids)]]}
    return {"headers": ["Setting", *run_ids], "data": [[row["setting"], *[row.get(r, "") for r in run_ids]] for row in diff]}


def _p(p) -> str:
    return "—" if p is None else f"{p:.3g}"


def board_rows(board: dict) -> list[list]:
    rows = []
    for i, r in enumerate(board.get("rows") or []):
        rows.append([
            i + 1,
            r["run"],
            f"{_pct(r['accuracy'])} [{_pct(r['ci'][0])}–{_pct(r['ci'][1])}]",
            _pct(r["base_accuracy"]),
            _p(r.get("p_vs_base")),
            "best" if i == 0 else _p(r.get("p_vs_best")),
            "—" if r.get("format") is None else _pct(r["format"]),
            r["n"],
        ])
    return rows


def board_note_html(board: dict) -> str:
    """What the leaderboard is on, who is missing from it, and how to read p."""
    parts = [f"Problem set <b>{_e(board.get('set', ''))}</b>: each run's trained model on the same problems "
             "(greedy), ranked by accuracy; <i>p vs best</i> is an exact McNemar test against the top run on the "
             "problems both answered (p &lt; 0.05: the gap is unlikely to be luck)."]
    if board.get("missing"):
        parts.append(f"Not scored on it yet: {_e(', '.join(board['missing']))} (press <b>Score the missing runs</b>).")
    if board.get("apart"):
        parts.append(f"Scored on other problems under that name (another data source), so not ranked here: "
                     f"{_e(', '.join(board['apart']))}.")
    return "<div class='board-note'>" + "<br>".join(parts) + "</div>"
