"""Charts: recorded metrics in, Plotly figures out; only recorded values are drawn, stages shaded,
zoom kept across redraws (uirevision = run id)."""

import math

import plotly.graph_objects as go
import pytest

from grpo_app.ui import charts


def metrics(n_per_stage=(3, 2), reward=lambda s: 0.1 * s):
    out, step = [], 0
    for k, n in enumerate(n_per_stage):
        for i in range(n):
            step += 1
            out.append(
                {
                    "step": step,
                    "stage": k,
                    "stage_name": f"st{k}",
                    "stage_step": i + 1,
                    "reward": reward(step),
                    "rewards": {"correctness": 0.5, "strict_format": 0.25 * k},
                    "loss": 0.01 * step,
                    "kl": None,
                    "ewc_penalty": 0.0 if k == 0 else 0.2,
                    "completion_length": 40 + step,
                    "truncated_ratio": 0.1,
                    "stopped_at_answer": 0.5,
                    "tokens_per_s": 100.0 + step,
                    "gen_tokens_per_s": 150.0,
                    "completions_per_s": 2.0,
                }
            )
    return out


def trace_names(fig):
    return [t.name for t in fig.data]


def test_smooth_is_debiased_ema():
    assert charts.smooth([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])  # no pull towards 0 at the start
    assert charts.smooth([0.0, 1.0], 0.0) == [0.0, 1.0]  # weight 0 = raw values
    s = charts.smooth([0.0, 1.0], 0.5)
    assert s[0] == 0.0 and 0.0 < s[1] < 1.0


def test_stage_spans_from_plan_and_from_metrics():
    plan = charts.stage_spans([], [{"name": "a", "steps": 3}, {"name": "b", "steps": 2}])
    assert [(s["name"], s["x0"], s["x1"]) for s in plan] == [("a", 0.5, 3.5), ("b", 3.5, 5.5)]
    seen = charts.stage_spans(metrics((3, 2)))
    assert [(s["index"], s["x0"], s["x1"]) for s in seen] == [(0, 0.5, 3.5), (1, 3.5, 5.5)]


def test_reward_figure_has_total_smoothed_and_each_reward_function():
    fig = charts.reward_figure(
        metrics(), [{"name": "st0", "steps": 3}, {"name": "st1", "steps": 2}], uirevision="run-1"
    ).figure()
    assert trace_names(fig) == ["total reward", "total (smoothed)", "correctness", "strict_format"]
    assert list(fig.data[0].x) == [1, 2, 3, 4, 5]
    assert list(fig.data[0].y) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert fig.layout.uirevision == "run-1"
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rects) == 2 and (rects[0].x0, rects[0].x1) == (0.5, 3.5)  # every stage shaded
    assert {a.text for a in fig.layout.annotations} >= {"1: st0", "2: st1"}
    assert tuple(fig.layout.xaxis.range) == (0.5, 5.5)  # the whole plan, so the run grows into the chart


def test_missing_and_non_finite_values_are_not_drawn():
    recs = metrics((3,))
    recs[1]["reward"] = None
    recs[2]["reward"] = float("nan")
    fig = charts.reward_figure(recs).figure()
    assert list(fig.data[0].x) == [1]  # only the recorded, finite value
    assert charts._num(float("inf")) is None and charts._num(True) is None and charts._num("x") is None


def test_empty_inputs_give_a_message_not_an_error():
    for fig in (
        charts.reward_figure([]),
        charts.loss_figure([]),
        charts.length_figure([]),
        charts.throughput_figure([]),
        charts.memory_figure([]),
        charts.difficulty_figure({}),
    ):
        fig = fig.figure()
        assert len(fig.data) == 0 and fig.layout.annotations and fig.layout.annotations[0].text


def test_loss_figure_puts_kl_and_ewc_on_the_right_axis_and_notes_missing_kl():
    fig = charts.loss_figure(metrics()).figure()
    assert trace_names(fig) == ["loss", "EWC penalty"]
    assert fig.data[1].yaxis == "y2"
    assert any("KL not computed" in (a.text or "") for a in fig.layout.annotations)
    recs = metrics()
    for r in recs:
        r["kl"] = 0.01
    assert "KL" in trace_names(charts.loss_figure(recs).figure())


def test_length_and_throughput_figures():
    fig = charts.length_figure(metrics()).figure()
    assert trace_names(fig) == ["mean length (tokens)", "truncated (share)", "stopped at '####' (share)"]
    assert tuple(fig.layout.yaxis2.range) == (0, 1.05)
    forced = metrics()
    for r in forced:
        r["forced_answer_line"] = 0.25  # trainer.py, departure 8: the share given the answer-line hint
    fig = charts.length_figure(forced).figure()
    assert trace_names(fig)[-1] == "given the '\\n####' hint (share)" and fig.data[-1].yaxis == "y2"
    assert list(fig.data[-1].y) == [0.25] * len(forced)
    fig = charts.throughput_figure(metrics()).figure()
    assert trace_names(fig) == ["tokens/s (whole step)", "tokens/s (generation)", "completions/s"]


def test_time_spans_stage_and_fisher_periods():
    ev = [
        {"time": 100.0, "event": "stage_start", "stage": 0, "name": "a"},
        {"time": 160.0, "event": "stage_end", "stage": 0},
        {"time": 190.0, "event": "fisher_done", "stage": 0},
        {"time": 190.0, "event": "stage_start", "stage": 1, "name": "b"},
    ]
    spans = charts.time_spans(ev, t0=100.0, t_end=250.0)
    assert [(s["kind"], s["index"], s["x0"], s["x1"]) for s in spans] == [
        ("stage", 0, 0.0, 1.0),
        ("fisher", 0, 1.0, 1.5),
        ("stage", 1, 1.5, 2.5),  # still open: runs to t_end
    ]


def test_memory_figure_breaks_the_line_at_gaps_and_marks_the_peak():
    mem = [{"time": 100.0 + 0.5 * i, "rss_mb": 500.0 + i} for i in range(10)]
    mem += [{"time": 200.0 + 0.5 * i, "rss_mb": 600.0} for i in range(4)]  # after a resume: 95 s later
    fig = charts.memory_figure(mem, [], t0=100.0, uirevision="r").figure()
    xs = list(fig.data[0].x)
    assert None in xs and xs.index(None) == 10
    assert any("peak 600 MB" in (a.text or "") for a in fig.layout.annotations)


def test_memory_figure_thins_long_series_but_keeps_the_peak():
    mem = [{"time": float(i), "rss_mb": 100.0} for i in range(10_000)]
    mem[5_001]["rss_mb"] = 999.0
    fig = charts.memory_figure(mem, [], gap_s=5.0).figure()
    ys = [y for y in fig.data[0].y if y is not None]
    assert len(ys) <= charts.MAX_MEMORY_POINTS + 2 and max(ys) == 999.0


def test_training_figures_share_the_run_id_as_uirevision():
    view = {
        "run_id": "r7",
        "metrics": metrics(),
        "events": [],
        "memory": [{"time": 1.0, "rss_mb": 10.0}],
        "stages": [{"name": "st0", "steps": 3}, {"name": "st1", "steps": 2}],
        "started": 1.0,
    }
    figs = charts.training_figures(view)
    assert set(figs) == {"reward", "loss", "length", "memory", "throughput"}
    assert all(f.figure().layout.uirevision == "r7" for f in figs.values())


def compare_result():
    def summary(acc1, acc2):
        return {
            "by_difficulty": {
                "1": {"n": 10, "accuracy": acc1, "ci": (max(0, acc1 - 0.2), min(1, acc1 + 0.2))},
                "3": {"n": 5, "accuracy": acc2, "ci": (0.0, 0.6)},
            }
        }

    return {
        "key": "k1",
        "base_label": "base-model",
        "trained_label": "trained-model",
        "base": {"summary": summary(0.3, 0.2)},
        "trained": {"summary": summary(0.5, 0.4)},
    }


def test_difficulty_figure_bars_with_asymmetric_wilson_error_bars():
    fig = charts.difficulty_figure(compare_result()).figure()
    assert [t.type for t in fig.data] == ["bar", "bar"]
    base, trained = fig.data
    assert list(base.x) == ["1", "3"] and list(trained.y) == [0.5, 0.4]
    assert list(base.error_y.array) == pytest.approx([0.2, 0.4]) and list(base.error_y.arrayminus) == pytest.approx(
        [0.2, 0.2]
    )
    assert list(base.customdata) == [10, 5]
    assert fig.layout.uirevision == "k1" and fig.layout.barmode == "group"
    assert not any(isinstance(v, float) and math.isnan(v) for v in base.y)


def test_shading_and_the_peak_line_are_what_plotlys_own_calls_make():
    """The charts give their stage bands, boundary lines, labels and the memory peak to the figure as plain
    layout dicts in one update_layout (one call at a time they were most of a chart's build time, at every step
    a page draws): the same shapes and annotations as Plotly's add_vrect / add_vline / add_annotation /
    add_hline."""
    spans = [
        {"kind": "stage", "index": 0, "name": "st0", "x0": 0.5, "x1": 3.5},
        {"kind": "fisher", "index": 0, "name": "Fisher 1", "x0": 3.5, "x1": 4.0},
        {"kind": "stage", "index": 5, "name": "st1", "x0": 4.0, "x1": 9.5},
    ]
    ref = go.Figure()
    for sp in spans:
        fisher = sp["kind"] == "fisher"
        fill = charts.FISHER_FILL if fisher else charts.STAGE_FILLS[sp["index"] % len(charts.STAGE_FILLS)]
        ref.add_vrect(x0=sp["x0"], x1=sp["x1"], fillcolor=fill, line_width=0, layer="below", name=sp["name"])
        if not fisher:
            ref.add_vline(x=sp["x0"], line=dict(color="rgba(80,80,80,0.55)", width=1, dash="dot"))
        ref.add_annotation(
            x=(sp["x0"] + sp["x1"]) / 2, y=1.0, xref="x", yref="paper", yanchor="top",
            text=sp["name"] if fisher else f"{sp['index'] + 1}: {sp['name']}", showarrow=False,
            font=dict(size=12, color="#444"), bgcolor="rgba(255,255,255,0.6)",
        )
    shapes, notes = charts._shade(spans)
    fig = go.Figure()
    fig.update_layout(shapes=shapes, annotations=notes)
    assert fig.layout.shapes == ref.layout.shapes and fig.layout.annotations == ref.layout.annotations

    mem = [{"time": 100.0 + i, "rss_mb": 500.0 + (100 if i == 3 else 0)} for i in range(6)]
    fig = charts.memory_figure(mem, [], 100.0, "r").figure()
    ref = go.Figure()
    ref.add_hline(
        y=600.0, line=dict(color="rgba(204,121,167,0.6)", width=1, dash="dot"),
        annotation_text="peak 600 MB", annotation_position="top left",
    )
    assert fig.layout.shapes[0] == ref.layout.shapes[0] and fig.layout.annotations[0] == ref.layout.annotations[0]


def passk_result(k=6):
    def curve(p):
        ks = list(range(1, k + 1))
        ys = [1 - (1 - p) ** j for j in ks]
        return {"k": ks, "pass": ys, "ci": [(max(0.0, y - 0.1), min(1.0, y + 0.1)) for y in ys], "n_problems": 12}

    return {
        "key": "k2",
        "base": {"pass_k": {"k": k, "temperature": 1.0, "curve": curve(0.1)}},
        "trained": {"pass_k": {"k": k, "temperature": 1.0, "curve": curve(0.3)}},
    }


def every_chart():
    """Each builder on the inputs that take its different paths (empty, a right axis or not, KL or not, stage
    plan or not, gaps and Fisher passes in the memory chart, a long pass@k axis)."""
    plan = [{"name": "st0", "steps": 3}, {"name": "st1", "steps": 2}]
    with_kl = metrics()
    for r in with_kl:
        r["kl"] = 0.02
    bare = [{"step": i + 1, "stage": 0, "reward": 0.5, "loss": 0.1, "completion_length": 9.0, "tokens_per_s": 5.0}
            for i in range(3)]
    mem = [{"time": 100.0 + 0.5 * i, "rss_mb": 500.0 + i} for i in range(10)] + [{"time": 300.0, "rss_mb": 90.0}]
    events = [
        {"time": 100.0, "event": "stage_start", "stage": 0, "name": "a"},
        {"time": 102.0, "event": "stage_end", "stage": 0},
        {"time": 103.0, "event": "fisher_done", "stage": 0},
        {"time": 103.0, "event": "stage_start", "stage": 1, "name": "b"},
    ]
    out = []
    for recs, stages, rev in ((metrics(), plan, "r1"), (with_kl, None, None), (bare, plan, "r2"), ([], None, None)):
        out += [f(recs, stages, rev) for f in (charts.reward_figure, charts.loss_figure, charts.length_figure,
                                               charts.throughput_figure)]
    out += [charts.memory_figure(mem, events, 99.0, "r"), charts.memory_figure(mem), charts.memory_figure([])]
    out += [charts.difficulty_figure(compare_result()), charts.difficulty_figure({})]
    out += [charts.passk_figure(passk_result(6)), charts.passk_figure(passk_result(32)), charts.passk_figure({})]
    return out


def test_every_chart_writes_the_json_plotly_writes_for_it():
    """The charts are plain dicts (Plotly's validation of every property was ~0.2 s of CPU per step of a watched
    run, taken from the training); their JSON must be what Plotly makes of the same figure, validated: a property
    Plotly does not know raises in figure(), one it would write in another form differs here."""
    import json

    charts_ = every_chart()
    assert len(charts_) == 24
    for chart in charts_:
        ours = json.loads(chart.to_json())
        assert ours == json.loads(chart.figure().to_json()), chart.layout.get("title")
        assert ours["layout"]["template"]["layout"]["paper_bgcolor"] == "white"  # plotly_white, written out


def test_chart_layout_updates_merge_like_plotly():
    chart = charts.Chart().update_layout(yaxis=dict(title=dict(text="a"), range=(0, 1)), title=dict(text="t"))
    chart.update_layout(yaxis=dict(tickformat=".0%", range=[0, 2]), title=None)
    ref = go.Figure()
    ref.update_layout(yaxis=dict(title=dict(text="a"), range=(0, 1)), title=dict(text="t"))
    ref.update_layout(yaxis=dict(tickformat=".0%", range=[0, 2]), title=None)
    assert chart.layout == {"yaxis": {"title": {"text": "a"}, "range": [0, 2], "tickformat": ".0%"}}
    fig = chart.figure()
    assert fig.layout.yaxis == ref.layout.yaxis and fig.layout.title.text is None is ref.layout.title.text
    with pytest.raises(ValueError):  # what the plain dicts do not check, the validated figure does
        charts.Chart().add_trace("scatter", x=[1], colour="red").figure()


def test_matrix_figure_draws_one_heatmap_per_run_with_intervals_on_hover():
    cell = {"accuracy": 0.5, "ci": [0.4, 0.6], "n": 10, "correct": 5, "format_rate": 1.0,
            "vs_before": {"delta": 0.3, "p_value": 0.0123, "only_before": 0, "only_after": 3}}
    base = {"accuracy": 0.2, "ci": [0.1, 0.3], "n": 10, "correct": 2, "format_rate": 0.0}
    m = {"tasks": [{"stage": 0, "name": "add"}, {"stage": 1, "name": "sub"}], "stages": ["add", "sub"],
         "base": [base, base], "rows": [[cell, cell], [cell, cell]]}
    chart = charts.matrix_figure([("run-a (EWC λ 1000)", m), ("run-b (no EWC)", m)])
    fig = chart.figure()  # Plotly accepts every property
    assert [t.type for t in fig.data] == ["heatmap", "heatmap"]
    assert list(fig.data[0].y) == ["base", "after stage 1: add", "after stage 2: sub"]
    assert [list(r) for r in fig.data[0].z] == [[20.0, 20.0], [50.0, 50.0], [50.0, 50.0]]
    assert fig.data[1].xaxis == "x2" and fig.layout.xaxis2.domain[0] > fig.layout.xaxis.domain[1]
    hover = fig.data[0].customdata[1][0]
    assert "50.0% [40.0%, 60.0%] of 10" in hover and "+30.0 points vs the row above (p = 0.012)" in hover
    assert "vs the row above" not in fig.data[0].customdata[0][0]  # the base row has nothing above it
    assert {a.text.split("<br>")[0] for a in fig.layout.annotations} == {"<b>run-a</b>", "<b>run-b</b>"}
