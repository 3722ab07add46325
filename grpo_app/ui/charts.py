"""Training and evaluation charts: recorded metrics -> Plotly figures. No Gradio import.

Each builder returns a `Chart`: the figure as the plain dicts of Plotly's JSON, not a `plotly.graph_objects`
figure. The live charts are rebuilt at every step of a run while pages watch, on the cores the training
uses, and a `go.Figure` validated every property of every trace and shape as it was set: ~0.2 s of CPU for
the four step charts on a slow host, 94% of it validation and copying Plotly's template (its JSON is 6%).
`Chart.to_json()` writes the same JSON without that; `Chart.figure()` gives the validated `go.Figure`
(tests check the two agree for every chart, so a property Plotly would reject or rewrite fails there).

Every figure shows only what the run recorded (a metric that was never logged gets no trace) and
marks the curriculum: step charts shade each stage's steps, the memory chart (wall-clock time)
shades stages and the Fisher passes between them. `layout.uirevision` is set to the run id so a
browser that re-renders a figure with the same uirevision keeps the user's zoom.

Inputs are the plain records of `manager.RunStore` / a run folder:
  metrics  [{step, stage, stage_name, reward, rewards{name: mean}, loss, kl, ewc_penalty, ...}]
  events   [{time, event, stage, name, ...}]
  memory   [{time, rss_mb}]
  stages   [{name, steps}] (the config's plan; optional, else derived from the metrics)
"""

from __future__ import annotations

import copy
import functools
import math
import re

import orjson
import plotly.graph_objects as go
import plotly.io as pio

# Okabe-Ito: distinguishable for colour-blind viewers and on a washed-out projector.
COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
STAGE_FILLS = ["rgba(0,114,178,0.08)", "rgba(230,159,0,0.12)", "rgba(0,158,115,0.10)", "rgba(204,121,167,0.10)"]
FISHER_FILL = "rgba(120,120,120,0.18)"
FONT = dict(size=15)
HEIGHT = 370
MAX_MEMORY_POINTS = 2000


# ------------------------------------------------------------------------------------------------
# A figure as plain dicts
# ------------------------------------------------------------------------------------------------
def _merge(dst: dict, src: dict) -> dict:
    """Plotly's `update_layout`: nested dicts merge, anything else (lists included) replaces; None unsets."""
    for key, value in src.items():
        if value is None:
            dst.pop(key, None)
        elif isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value)
        else:
            dst[key] = _plain(value)
    return dst


def _plain(value):
    """A property value as Plotly writes it: dicts without None-valued keys (an unset property), tuples as lists;
    lists keep their None items (a gap in a line)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) if isinstance(v, (dict, list, tuple)) else v for v in value]
    return value


@functools.lru_cache(maxsize=4)
def _template_json(name: str) -> bytes:
    """A named Plotly template as the JSON a figure's layout carries (Plotly copies it into every figure)."""
    return orjson.dumps(pio.templates[name].to_plotly_json())


class Chart:
    """A Plotly figure as plain dicts: `data` (one dict per trace, with its `type`) and `layout`, built with the
    few calls of `go.Figure` the builders use (`add_trace`, `update_layout`, `add_annotation`). A named
    `layout.template` is written out as Plotly does; nothing else is checked here: `figure()` checks it all."""

    __slots__ = ("data", "layout")

    def __init__(self):
        self.data: list[dict] = []
        self.layout: dict = {}

    def add_trace(self, kind: str, **props) -> Chart:
        self.data.append({"type": kind, **_plain(props)})
        return self

    def update_layout(self, **props) -> Chart:
        _merge(self.layout, props)
        return self

    def add_annotation(self, **props) -> Chart:
        self.layout.setdefault("annotations", []).append(_plain(props))
        return self

    def to_json(self) -> str:
        """The figure's JSON, as `go.Figure.to_json()` writes it (what a Gradio Plot takes)."""
        layout = self.layout
        if isinstance(layout.get("template"), str):  # the cached template's JSON, not parsed and encoded again
            layout = {**layout, "template": orjson.Fragment(_template_json(layout["template"]))}
        return orjson.dumps({"data": self.data, "layout": layout}).decode()

    def figure(self) -> go.Figure:
        """The validated Plotly figure (raises on a property Plotly does not know)."""
        return go.Figure({"data": copy.deepcopy(self.data), "layout": copy.deepcopy(self.layout)})


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------
def _num(v) -> float | None:
    """A finite float or None (JSONL stores NaN/inf as null; be defensive anyway)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _series(metrics: list[dict], key: str) -> tuple[list, list]:
    """(steps, values) for every record where `key` was recorded."""
    xs, ys = [], []
    for r in metrics:
        v = _num(r.get(key))
        if v is not None and r.get("step") is not None:
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def smooth(values: list[float], weight: float = 0.6) -> list[float]:
    """Debiased exponential moving average (TensorBoard's smoothing); weight 0 = no smoothing."""
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last = weight * last + (1 - weight) * v
        norm = weight * norm + (1 - weight)
        out.append(last / norm if norm else v)
    return out


def stage_spans(metrics: list[dict], stages: list[dict] | None = None) -> list[dict]:
    """Stage extents on the step axis: [{index, name, x0, x1}] (x0/x1 halfway between steps).

    With `stages` (the config's plan) the spans cover every planned step, including steps not yet
    trained; otherwise they are read off the recorded metrics.
    """
    spans = []
    if stages:
        offset = 0
        for k, s in enumerate(stages):
            n = int(s.get("steps") or 0)
            spans.append(
                {"index": k, "name": str(s.get("name", f"stage {k + 1}")), "x0": offset + 0.5, "x1": offset + n + 0.5}
            )
            offset += n
        return spans
    by_stage: dict[int, dict] = {}
    for r in metrics:
        k, step = r.get("stage"), r.get("step")
        if k is None or step is None:
            continue
        sp = by_stage.setdefault(
            int(k), {"index": int(k), "name": str(r.get("stage_name", f"stage {k + 1}")), "lo": step, "hi": step}
        )
        sp["lo"], sp["hi"] = min(sp["lo"], step), max(sp["hi"], step)
    for k in sorted(by_stage):
        sp = by_stage[k]
        spans.append({"index": k, "name": sp["name"], "x0": sp["lo"] - 0.5, "x1": sp["hi"] + 0.5})
    return spans


def time_spans(events: list[dict], t0: float, t_end: float | None = None) -> list[dict]:
    """Stage and Fisher periods in minutes since `t0`: [{kind: 'stage'|'fisher', index, name, x0, x1}]."""
    spans: list[dict] = []
    open_stage: dict | None = None
    fisher_from: float | None = None
    last_t = t0

    def minutes(t):
        return (t - t0) / 60.0

    for ev in sorted(events, key=lambda e: e.get("time", 0)):
        t, kind = ev.get("time"), ev.get("event")
        if t is None:
            continue
        last_t = max(last_t, t)
        if kind == "stage_start":
            if open_stage is not None:  # a resumed stage restarts; close the interrupted span
                open_stage["x1"] = minutes(t)
                spans.append(open_stage)
            k = int(ev.get("stage", 0))
            open_stage = {"kind": "stage", "index": k, "name": str(ev.get("name", f"stage {k + 1}")), "x0": minutes(t)}
        elif kind in ("stage_end", "stopped", "error", "finished") and open_stage is not None:
            open_stage["x1"] = minutes(t)
            spans.append(open_stage)
            open_stage = None
        if kind == "stage_end":
            fisher_from = t
        elif kind == "fisher_done" and fisher_from is not None:
            k = int(ev.get("stage", 0))
            spans.append(
                {"kind": "fisher", "index": k, "name": f"Fisher {k + 1}", "x0": minutes(fisher_from), "x1": minutes(t)}
            )
            fisher_from = None
    if open_stage is not None:
        open_stage["x1"] = minutes(t_end if t_end is not None else last_t)
        spans.append(open_stage)
    return spans


def _shade(spans: list[dict], label: bool = True) -> tuple[list[dict], list[dict]]:
    """(shapes, annotations): a shaded band (and a boundary line with the stage name) for each span, behind the
    traces. Plain layout dicts, the ones `go.Figure.add_vrect` / `add_vline` / `add_annotation` would make (a test
    checks it), given to the chart in one `update_layout`."""
    shapes, notes = [], []
    for sp in spans:
        fisher = sp.get("kind") == "fisher"
        fill = FISHER_FILL if fisher else STAGE_FILLS[sp["index"] % len(STAGE_FILLS)]
        shapes.append(
            dict(type="rect", x0=sp["x0"], x1=sp["x1"], xref="x", y0=0, y1=1, yref="y domain", fillcolor=fill,
                 line=dict(width=0), layer="below", name=sp["name"])
        )
        if not fisher:
            shapes.append(
                dict(type="line", x0=sp["x0"], x1=sp["x0"], xref="x", y0=0, y1=1, yref="y domain",
                     line=dict(color="rgba(80,80,80,0.55)", width=1, dash="dot"))
            )
        if label:
            notes.append(
                dict(
                    x=(sp["x0"] + sp["x1"]) / 2,
                    y=1.0,
                    xref="x",
                    yref="paper",
                    yanchor="top",
                    text=sp["name"] if fisher else f"{sp['index'] + 1}: {sp['name']}",
                    showarrow=False,
                    font=dict(size=12, color="#444"),
                    bgcolor="rgba(255,255,255,0.6)",
                )
            )
    return shapes, notes


def _layout(
    fig: Chart, title: str, xtitle: str, ytitle: str, uirevision, y2title: str | None = None, **more
) -> Chart:
    """The layout every chart shares, then `more` (shapes, annotations, axes...) merged into it."""
    layout = dict(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=18)),
        template="plotly_white",
        font=FONT,
        height=HEIGHT,
        margin=dict(l=60, r=60 if y2title else 20, t=60, b=100),
        legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="left", x=0),
        hovermode="x unified",
        uirevision=uirevision if uirevision is not None else "static",
        xaxis=dict(title=dict(text=xtitle)),  # the form Plotly writes a bare title in
        yaxis=dict(title=dict(text=ytitle)),
    )
    if y2title:
        layout["yaxis2"] = dict(title=dict(text=y2title), overlaying="y", side="right", showgrid=False)
    return fig.update_layout(**layout).update_layout(**more)


def empty_figure(title: str, message: str, uirevision=None) -> Chart:
    fig = Chart()
    _layout(fig, title, "", "", uirevision)
    fig.update_layout(xaxis=dict(visible=False), yaxis=dict(visible=False))
    fig.add_annotation(
        text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=16, color="#666")
    )
    return fig


def _step_axis(spans: list[dict]) -> dict:
    """The x axis of a step chart: the whole plan's steps when known, from 0, whole numbers."""
    axis = dict(rangemode="tozero", tickformat="d")
    if spans:
        axis["range"] = [min(s["x0"] for s in spans), max(s["x1"] for s in spans)]
    return axis


def _line(fig: Chart, xs, ys, name: str, color: str, width: int = 2, dash: str | None = None,
          markers: bool = False, right: bool = False, **kw) -> bool:
    """Add one line (markers too with `markers`, on the right-hand axis with `right`); nothing when there
    are no points. Returns whether it was added."""
    if not xs:
        return False
    fig.add_trace(
        "scatter",
        x=xs,
        y=ys,
        name=name,
        mode="lines+markers" if markers else "lines",
        line=dict(color=color, width=width, dash=dash),
        yaxis="y2" if right else None,
        **kw,
    )
    return True


def _step_figure(metrics, stages, title: str, ytitle: str, uirevision, add_traces, y2title: str | None = None):
    """A chart over optimizer steps: `add_traces(fig)` draws the lines (returns whether a right-axis line was
    drawn), then the stages are shaded and the axes laid out the same way for every training chart."""
    fig = Chart()
    right = add_traces(fig)
    spans = stage_spans(metrics, stages)
    shapes, notes = _shade(spans)
    _layout(
        fig, title, "step", ytitle, uirevision, y2title=y2title if right else None,
        shapes=shapes, annotations=notes, xaxis=_step_axis(spans),
    )
    return fig, right


# ------------------------------------------------------------------------------------------------
# Training charts (x = optimizer step)
# ------------------------------------------------------------------------------------------------
def reward_figure(metrics: list[dict], stages: list[dict] | None = None, uirevision=None, smoothing: float = 0.6):
    """Mean total reward per step, its smoothed line, and each reward function's mean."""
    title = "Reward"
    xs, ys = _series(metrics, "reward")
    if not xs:
        return empty_figure(title, "No steps recorded yet.", uirevision)
    names: list[str] = []
    for r in metrics:
        for name in r.get("rewards") or {}:
            if name not in names:
                names.append(name)

    def traces(fig):
        _line(fig, xs, ys, "total reward", COLORS[0], width=1, markers=True, marker=dict(size=6), opacity=0.55)
        _line(fig, xs, smooth(ys, smoothing), "total (smoothed)", COLORS[0], width=4)
        for i, name in enumerate(names):
            pts = [(r["step"], _num((r.get("rewards") or {}).get(name))) for r in metrics]
            pts = [(x, v) for x, v in pts if v is not None]
            _line(fig, [x for x, _ in pts], [v for _, v in pts], name, COLORS[(i + 1) % len(COLORS)], dash="dot")
        return False

    return _step_figure(metrics, stages, title, "mean reward", uirevision, traces)[0]


def loss_figure(metrics: list[dict], stages: list[dict] | None = None, uirevision=None):
    """GRPO loss (left axis); KL to the reference and the EWC penalty (right axis)."""
    title = "Loss, KL and EWC penalty"
    xs, ys = _series(metrics, "loss")
    if not xs:
        return empty_figure(title, "No steps recorded yet.", uirevision)

    kx, ky = _series(metrics, "kl")

    def traces(fig):
        _line(fig, xs, ys, "loss", COLORS[0], width=3, markers=True)
        kl = _line(fig, kx, ky, "KL", COLORS[2], right=True)
        ewc = _line(fig, *_series(metrics, "ewc_penalty"), "EWC penalty", COLORS[3], dash="dash", markers=True, right=True)
        return kl or ewc

    fig, _ = _step_figure(metrics, stages, title, "loss", uirevision, traces, y2title="KL / EWC penalty")
    if not kx:
        fig.add_annotation(
            text="KL not computed (beta = 0)",
            x=1,
            y=-0.02,
            xref="paper",
            yref="paper",
            xanchor="right",
            yanchor="bottom",
            showarrow=False,
            font=dict(size=11, color="#777"),
        )
    return fig


def length_figure(metrics: list[dict], stages: list[dict] | None = None, uirevision=None):
    """Mean completion length (tokens, left) and the share truncated / stopped at the answer / given the forced
    answer-line hint (right)."""
    title = "Completion length"
    xs, ys = _series(metrics, "completion_length")
    if not xs:
        return empty_figure(title, "No steps recorded yet.", uirevision)

    def traces(fig):
        _line(fig, xs, ys, "mean length (tokens)", COLORS[0], width=3, markers=True)
        cut = _line(fig, *_series(metrics, "truncated_ratio"), "truncated (share)", COLORS[3], dash="dash", right=True)
        stop = _line(
            fig, *_series(metrics, "stopped_at_answer"), "stopped at '####' (share)", COLORS[2], dash="dot", right=True
        )
        # trainer.py, departure 8: how many answers the trainer began for the model (none when the option is off)
        forced = _line(fig, *_series(metrics, "forced_answer_line"), "given the '\\n####' hint (share)", COLORS[4],
                       dash="dashdot", right=True)
        return cut or stop or forced

    fig, right = _step_figure(metrics, stages, title, "tokens", uirevision, traces, y2title="share of completions")
    if right:
        fig.update_layout(yaxis2=dict(range=[0, 1.05], tickformat=".0%"))
    return fig


def throughput_figure(metrics: list[dict], stages: list[dict] | None = None, uirevision=None):
    """Generated tokens per second of wall time (whole step and generation only), completions per second."""
    title = "Throughput"
    xs, ys = _series(metrics, "tokens_per_s")
    if not xs:
        return empty_figure(title, "No steps recorded yet.", uirevision)

    def traces(fig):
        _line(fig, xs, ys, "tokens/s (whole step)", COLORS[0], width=3, markers=True)
        _line(fig, *_series(metrics, "gen_tokens_per_s"), "tokens/s (generation)", COLORS[5], dash="dot")
        return _line(fig, *_series(metrics, "completions_per_s"), "completions/s", COLORS[1], dash="dash", right=True)

    return _step_figure(metrics, stages, title, "tokens / s", uirevision, traces, y2title="completions / s")[0]


# ------------------------------------------------------------------------------------------------
# Memory (x = wall-clock minutes, sampled every 0.5 s, generation included)
# ------------------------------------------------------------------------------------------------
def memory_figure(
    memory: list[dict], events: list[dict] | None = None, t0: float | None = None, uirevision=None, gap_s: float = 5.0
):
    """Process RSS over time; a gap (the process was not running, e.g. before a resume) breaks the line."""
    title = "Process memory (RSS)"
    pts = [(m.get("time"), _num(m.get("rss_mb"))) for m in memory]
    pts = [(t, v) for t, v in pts if t is not None and v is not None]
    if not pts:
        return empty_figure(title, "No memory samples yet.", uirevision)
    pts.sort()
    if len(pts) > MAX_MEMORY_POINTS:  # keep the figure light; keep the peak visible
        stride = math.ceil(len(pts) / MAX_MEMORY_POINTS)
        peak = max(pts, key=lambda p: p[1])
        pts = sorted(set(pts[::stride] + [pts[-1], peak]))
    t0 = pts[0][0] if t0 is None else min(t0, pts[0][0])
    xs, ys = [], []
    prev = None
    for t, v in pts:
        if prev is not None and t - prev > gap_s:
            xs.append(None)
            ys.append(None)
        xs.append((t - t0) / 60.0)
        ys.append(v)
        prev = t
    fig = Chart()
    _line(fig, xs, ys, "RSS (MB)", COLORS[4], width=3, connectgaps=False)
    peak = max(v for _, v in pts)
    # the peak: a dotted line across the chart with its value at the top left (what fig.add_hline makes)
    peak_line = dict(type="line", x0=0, x1=1, xref="x domain", y0=peak, y1=peak, yref="y",
                     line=dict(color="rgba(204,121,167,0.6)", width=1, dash="dot"))
    peak_note = dict(text=f"peak {peak:,.0f} MB", x=0, xanchor="left", xref="x domain", y=peak, yanchor="bottom",
                     yref="y", showarrow=False)
    shapes, notes = _shade(time_spans(events or [], t0, pts[-1][0]))
    _layout(
        fig, title, "minutes since start", "MB", uirevision,
        shapes=[peak_line, *shapes], annotations=[peak_note, *notes], yaxis=dict(rangemode="tozero"),
    )
    return fig


def training_figures(view: dict, memory: bool = True) -> dict[str, Chart]:
    """The training charts of one run view ({run_id, metrics, events, memory, stages, started}); the page
    builds the memory chart on its own clock (`memory=False` leaves it out)."""
    rev = view.get("run_id") or "none"
    metrics, stages = view.get("metrics") or [], view.get("stages")
    figs = {
        "reward": reward_figure(metrics, stages, rev),
        "loss": loss_figure(metrics, stages, rev),
        "length": length_figure(metrics, stages, rev),
        "throughput": throughput_figure(metrics, stages, rev),
    }
    if memory:
        figs["memory"] = memory_figure(view.get("memory") or [], view.get("events") or [], view.get("started"), rev)
    return figs


# ------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------
def difficulty_figure(result: dict, uirevision=None):
    """Accuracy by difficulty for base and trained, with 95% Wilson intervals as error bars."""
    title = "Accuracy by difficulty (95% intervals)"
    if not result or "base" not in result or "trained" not in result:
        return empty_figure(title, "Run a comparison to see this chart.", uirevision)
    fig = Chart()
    roles = (
        ("base", result.get("base_label") or "base", COLORS[5]),
        ("trained", result.get("trained_label") or "trained", COLORS[0]),
    )
    keys = sorted({int(d) for role, _, _ in roles for d in result[role]["summary"]["by_difficulty"]})
    for role, label, color in roles:
        by_d = result[role]["summary"]["by_difficulty"]
        xs, ys, up, down, ns = [], [], [], [], []
        for d in keys:
            v = by_d.get(str(d))
            if v is None:
                continue
            lo, hi = v["ci"]
            xs.append(str(d))
            ys.append(v["accuracy"])
            up.append(hi - v["accuracy"])
            down.append(v["accuracy"] - lo)
            ns.append(v["n"])
        fig.add_trace(
            "bar",
            x=xs,
            y=ys,
            name=f"{role}: {label}"[:60],
            marker=dict(color=color),
            error_y=dict(type="data", symmetric=False, array=up, arrayminus=down, thickness=2, width=6),
            customdata=ns,
            hovertemplate="difficulty %{x}: %{y:.1%} (n=%{customdata})<extra></extra>",
        )
    _layout(fig, title, "difficulty (calculation steps)", "accuracy", uirevision or result.get("key"))
    fig.update_layout(barmode="group", yaxis=dict(range=[0, 1.05], tickformat=".0%"), hovermode="closest")
    return fig


def passk_figure(result: dict, uirevision=None):
    """pass@1..K of base and trained (K sampled answers per problem), with 95% bootstrap intervals."""
    title = "pass@k: right within k tries (95% intervals)"
    curves = [
        (role, (result or {}).get(f"{role}_label") or role, color, ((result or {}).get(role) or {}).get("pass_k"))
        for role, color in (("base", COLORS[5]), ("trained", COLORS[0]))
    ]
    if not all(c[3] for c in curves):
        return empty_figure(title, "Set pass@k samples above 0 and compare to see this chart.", uirevision)
    fig = Chart()
    for role, label, color, pk in curves:
        cv = pk["curve"]
        ys = cv["pass"]
        fig.add_trace(
            "scatter",
            x=cv["k"],
            y=ys,
            mode="lines+markers",
            name=f"{role}: {label}"[:60],
            line=dict(color=color, width=3),
            error_y=dict(
                type="data",
                symmetric=False,
                array=[hi - y for (_, hi), y in zip(cv["ci"], ys)],
                arrayminus=[y - lo for (lo, _), y in zip(cv["ci"], ys)],
                thickness=1.5,
                width=4,
            ),
            hovertemplate="pass@%{x}: %{y:.1%}<extra>" + role + "</extra>",
        )
    pk = curves[0][3]
    _layout(
        fig,
        f"{title}<br><sup>{pk['k']} answers per problem sampled at temperature {pk['temperature']:g}, "
        f"n = {pk['curve']['n_problems']} problems</sup>",
        "k (tries)",
        "pass@k",
        uirevision or result.get("key"),
    )
    fig.update_layout(
        yaxis=dict(range=[0, 1.05], tickformat=".0%"), hovermode="x unified", margin=dict(t=80),
        xaxis=dict(tickmode="linear", dtick=1 if pk["k"] <= 16 else 4),
    )
    return fig


# ------------------------------------------------------------------------------------------------
# The stage x task matrix (grpo_app/evaluation/stage_matrix.py)
# ------------------------------------------------------------------------------------------------
def matrix_figure(matrices: list[tuple[str, dict]]) -> Chart:
    """One heatmap per (title, matrix) side by side: rows 'base' and 'after stage k', columns the stage tasks;
    each cell's accuracy, with its 95% interval and its change against the row above (exact McNemar p) on hover."""
    fig = Chart()
    n = max(1, len(matrices))
    gap = 0.08
    width = (1 - gap * (n - 1)) / n
    for i, (title, m) in enumerate(matrices):
        tasks = [f"task {t['stage'] + 1}: {t['name']}" for t in m["tasks"]]
        rows = [("base", m["base"]), *((f"after stage {k + 1}: {name}", row) for k, (name, row)
                                      in enumerate(zip(m["stages"], m["rows"])))]
        z, text, hover = [], [], []
        for label, cells in rows:
            z.append([100 * c["accuracy"] for c in cells])
            text.append([f"{100 * c['accuracy']:.0f}%" for c in cells])
            line = []
            for task, c in zip(tasks, cells):
                h = (f"{label}<br>{task}<br>{100 * c['accuracy']:.1f}% [{100 * c['ci'][0]:.1f}%, "
                     f"{100 * c['ci'][1]:.1f}%] of {c['n']}")
                if "vs_before" in c:
                    v = c["vs_before"]
                    h += f"<br>{100 * v['delta']:+.1f} points vs the row above (p = {v['p_value']:.2g})"
                line.append(h)
            hover.append(line)
        axis = "" if i == 0 else str(i + 1)
        fig.add_trace(
            "heatmap",
            z=z,
            x=tasks,
            y=[label for label, _ in rows],
            text=text,
            texttemplate="%{text}",
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            zmin=0,
            zmax=100,
            colorscale="Blues",
            reversescale=True,  # (Plotly's Blues runs dark to light: more right answers, darker)
            showscale=i == n - 1,
            colorbar=dict(title="accuracy %") if i == n - 1 else None,
            xaxis=f"x{axis}",
            yaxis=f"y{axis}",
        )
        lo = i * (width + gap)
        fig.update_layout(**{
            f"xaxis{axis}": dict(domain=[lo, lo + width], side="top"),
            f"yaxis{axis}": dict(autorange="reversed", anchor=f"x{axis}", showticklabels=i == 0),
        })
        head, _, rest = title.partition(" (")  # the run's name in bold, its date and what it is below it
        dated = re.fullmatch(r"(\d{8}-\d{6})-(.+)", head)  # a run id: <date>-<time>-<name>, long side by side
        below = " ".join(x for x in (dated.group(1) if dated else "", f"({rest}" if rest else "") if x)
        fig.add_annotation(text=f"<b>{dated.group(2) if dated else head}</b>" + (f"<br>{below}" if below else ""),
                           x=lo + width / 2, y=-0.05,
                           yanchor="top", xref="paper", yref="paper", showarrow=False, font=dict(size=13))
    fig.update_layout(template="plotly_white", font=FONT, height=120 + 70 * (len(matrices[0][1]["rows"]) + 1)
                      if matrices else HEIGHT, margin=dict(l=10, r=10, t=80, b=70))
    return fig


# ------------------------------------------------------------------------------------------------
# Runs side by side (issue 44)
# ------------------------------------------------------------------------------------------------
def overlay_figure(title: str, ytitle: str, series: list[dict], smoothing: float = 0.0, uirevision=None) -> Chart:
    """Several runs' values of one metric over steps, one colour per run (`series`: from
    `runs.side_by_side.overlay_series`); the hover names the run, its stage and the step."""
    fig = Chart()
    drawn = False
    for i, s in enumerate(series):
        ys = smooth(s["values"], smoothing) if smoothing else s["values"]
        drawn |= _line(
            fig, s["steps"], ys, s["run"], COLORS[i % len(COLORS)], width=3, markers=True, marker=dict(size=5),
            customdata=s["stages"],
            hovertemplate="%{fullData.name}<br>%{customdata}<br>step %{x}: %{y:.4g}<extra></extra>",
        )
    if not drawn:
        return empty_figure(title, "none of these runs recorded it", uirevision)
    return _layout(fig, title, "step", ytitle, uirevision, hovermode="closest",
                   xaxis=dict(rangemode="tozero", tickformat="d"))
