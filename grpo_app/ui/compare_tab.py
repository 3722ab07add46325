"""Compare tab: base vs trained on the same problems, in the background, with honest statistics.

The comparison runs in the studio's evaluation queue (one at a time, a few waiting at most). This
page follows it with a progress bar; closing the page lets an unwatched job cancel itself. Results
are cached per (models, problem set, N, seed, ...) by `evaluation.compare_models`, so asking again
is instant; a run's comparisons are also saved in its folder and listed on the Runs tab.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from grpo_app.evaluation.scoring import compare_csv
from grpo_app.evaluation.stage_matrix import ewc_label
from grpo_app.export.downloads import write_text_export
from grpo_app.runs.job_queue import DONE, QueueFullError
from grpo_app.ui import render
from grpo_app.ui.charts import matrix_figure, passk_figure
from grpo_app.ui.common import follow_job, guard, keep_pick, plot
from grpo_app.ui.forms import FormError
from grpo_app.ui.studio import Studio, difficulty_json

MODES = [("A run vs its base model", "run"), ("Any two models", "models")]


@dataclass
class CompareTab:
    refresh_fn: object
    refresh_inputs: list
    refresh_outputs: list


def problem_sets(studio: Studio, run_id) -> list[tuple[str, str]]:
    out = [("GSM8K test problems", "gsm8k")]
    try:
        cfg = studio.runs.get_run(run_id).config()
    except Exception:  # noqa: BLE001 - no run picked yet, or an unreadable one: GSM8K only
        return out
    for k, st in enumerate(cfg.stages):
        out.append(
            (
                f"Held-out problems like stage {k + 1}: {st.name} ({st.source}, difficulty {st.min_difficulty}-{st.max_difficulty})",
                f"stage:{k}",
            )
        )
    return out


def result_note(result: dict) -> str:
    parts = []
    what, origin = result.get("what") or "", result.get("origin") or ""
    if what.startswith("GSM8K") and "GSM8K" not in origin:
        parts.append(f"GSM8K is not available on this server, so the problems are {origin} instead.")
    elif what:
        parts.append(f"Problem set: {what}.")
    if isinstance(result.get("not_held_out"), str):
        parts.append(result["not_held_out"])
    ov = result.get("overlap_with_training")
    if isinstance(ov, dict) and "in_training" in ov:
        against = ov.get("checked_against") or "the run's training pools"
        if ov["in_training"]:
            commuted = f" ({ov['commuted']} with their terms in another order)" if ov.get("commuted") else ""
            parts.append(f"{ov['in_training']} of these {ov['n']} problems were also trained on{commuted}: checked "
                         f"against {against}.")
        else:
            parts.append(f"Checked: none of these {ov['n']} problems occurs in {against}, not even with its terms "
                         "in another order.")
    return " ".join(parts)


def create_compare_tab(studio: Studio) -> CompareTab:
    gr.Markdown(
        "Score two models **on the same problems** with greedy decoding. Accuracy reads the `####` answer, or "
        "else the last number (fair to a base model that never writes `####`); the **format rate** counts answers "
        "that end with a `#### <number>` line. Intervals are 95% Wilson intervals; the p-value is an exact "
        "McNemar test on the problems only one of the two models got right."
    )
    with gr.Row(equal_height=False):
        mode = gr.Radio(MODES, value="run", label="Compare", elem_id="compare-mode")
        run = gr.Dropdown(
            [],
            value=None,
            label="Run (its trained model vs the model it started from)",
            allow_custom_value=True,
            elem_id="compare-run",
        )
        base = gr.Textbox("embedded", label="Base model", visible=False, max_lines=1, elem_id="compare-base")
        trained = gr.Textbox(
            "", label="Trained model (run id, hub id or folder)", visible=False, max_lines=1, elem_id="compare-trained"
        )
    eval_set = gr.Dropdown(
        problem_sets(studio, None), value="gsm8k", label="Problems", allow_custom_value=True, elem_id="compare-set"
    )
    with gr.Row(equal_height=False):
        n = gr.Number(50, label=f"N problems (1–{studio.limits.max_eval_n})", precision=None, elem_id="compare-n")
        dmin = gr.Number(0, label="Min difficulty (GSM8K)", precision=None, elem_id="compare-dmin")
        dmax = gr.Number(10, label="Max difficulty (GSM8K)", precision=None, elem_id="compare-dmax")
        seed = gr.Number(0, label="Seed (which problems)", precision=None, elem_id="compare-seed")
        tokens = gr.Number(256, label="Max answer tokens", precision=None, elem_id="compare-tokens")
    with gr.Row(equal_height=False):
        pass_k = gr.Number(
            0,
            label=f"pass@k samples per problem (0 = off, up to {studio.limits.max_pass_k})",
            info="Also sample K answers per problem for both models and chart pass@1…K: how much of what a model "
            "can do in K tries it does on the first.",
            precision=None,
            elem_id="compare-passk-n",
        )
        pass_t = gr.Number(
            1.0, label="pass@k temperature", precision=None, elem_id="compare-passk-t", info="between 0.05 and 2"
        )
    with gr.Row():
        go = gr.Button("Compare", variant="primary", elem_id="compare-btn", scale=2)
        cancel = gr.Button("Cancel", elem_id="compare-cancel", scale=1)
    progress_view = gr.HTML(elem_id="compare-progress")
    summary = gr.HTML(elem_id="compare-summary")
    by_difficulty = gr.Plot(show_label=False, elem_id="compare-chart")
    passk_plot = gr.Plot(show_label=False, elem_id="compare-passk", visible=False)
    table = gr.Dataframe(
        headers=render.COMPARE_HEADERS,
        datatype=["number", "number", "str", "str", "str", "str", "str", "str"],
        interactive=False,
        wrap=True,
        label="Side by side",
        elem_id="compare-table",
        max_height=600,
        column_widths=["4%", "7%", "45%", "8%", "10%", "6%", "10%", "8%"],
    )
    csv_file = gr.File(label="Download the table as CSV", interactive=False, elem_id="compare-csv")
    job_id = gr.State(None)

    def on_mode(m):
        is_run = m == "run"
        return gr.update(visible=is_run), gr.update(visible=not is_run), gr.update(visible=not is_run)

    mode.change(on_mode, [mode], [run, base, trained], api_visibility="undocumented", show_progress="hidden")

    def on_run(run_id):
        sets = problem_sets(studio, run_id)
        return gr.update(choices=sets, value="gsm8k")

    run.change(on_run, [run], [eval_set], api_visibility="undocumented", show_progress="hidden")

    passk_json = gr.State(None)  # the pass@k figure of the last comparison (drawn by a follow-up event, so the
    # /compare API keeps its outputs)
    outputs = [job_id, progress_view, summary, by_difficulty, table, csv_file, passk_json]

    @guard("compare the models")
    def on_compare(
        mode,
        run,
        base,
        trained,
        problems,
        n,
        min_difficulty,
        max_difficulty,
        seed,
        max_tokens,
        pass_k_n,
        pass_temperature,
        request: gr.Request,
    ):
        skip = gr.skip()
        try:
            spec = studio.compare.compare_spec(
                mode,
                run,
                base,
                trained,
                problems,
                n,
                min_difficulty,
                max_difficulty,
                seed,
                max_tokens,
                pass_k=pass_k_n,
                pass_temperature=pass_temperature,
            )
        except FormError as e:
            yield None, _errors_html(e.errors), skip, skip, skip, skip, skip
            return
        watcher = getattr(request, "session_hash", None) if request is not None else None
        try:
            job = studio.compare.submit_compare(spec, watcher=watcher)
        except QueueFullError as e:
            yield None, _errors_html([("queue", f"The evaluation queue is full: {e}")]), skip, skip, skip, skip, skip
            return
        for now, html in follow_job(studio, job, watcher):
            if not now.finished:
                yield now.id, html, skip, skip, skip, skip, skip
        job = now
        if job.status != DONE:
            yield None, html, skip, skip, skip, skip, skip
            return
        res = job.result
        csv_path = write_text_export(f"compare-{res.get('key', 'result')}.csv", compare_csv(res))
        note = result_note(res)
        done_html = render.job_progress_html(job.snapshot()) + (
            f'<div class="origin">{render._e(note)}</div>' if note else ""
        )
        yield (
            None,
            done_html,
            render.compare_summary_html(res),
            plot(difficulty_json(res)),
            render.compare_rows(res),
            str(csv_path),
            passk_figure(res).to_json() if (res.get("base") or {}).get("pass_k") else "",
        )

    event = go.click(
        on_compare,
        [mode, run, base, trained, eval_set, n, dmin, dmax, seed, tokens, pass_k, pass_t],
        outputs,
        api_name="compare",
        concurrency_id="compare",
        concurrency_limit=8,
        show_progress="minimal",
    )
    event.then(_passk_update, [passk_json], [passk_plot], api_visibility="undocumented", show_progress="hidden")

    def on_cancel(jid, request: gr.Request):
        if jid:
            job = studio.evals.get(jid, touch=False)
            watcher = getattr(request, "session_hash", None)
            if job is not None:
                job.watchers.discard(watcher)
                if not job.watchers:
                    studio.evals.cancel(jid, "cancelled from its page")
        return None, '<div class="job job-bad">Cancelled.</div>'

    cancel.click(
        on_cancel, [job_id], [job_id, progress_view], cancels=[event], api_name="compare_cancel", concurrency_limit=None
    )

    matrix_other = _create_matrix_section(studio, run, seed)

    def refresh(current, other):
        ids = studio.runs.run_ids(with_model=True)
        return keep_pick(current, ids), keep_pick(other, ["", *ids])

    return CompareTab(refresh_fn=refresh, refresh_inputs=[run, matrix_other], refresh_outputs=[run, matrix_other])


def _create_matrix_section(studio: Studio, run, seed):
    """The stage x task matrix of the picked run (issue 42), beside a second run's (e.g. without EWC). Returns the
    second run's dropdown (the tab's refresh fills it)."""
    gr.Markdown(
        "### Stage × task matrix: what each stage taught, and what it kept\n"
        "The run's model as each stage ended, on held-out problems of **every** stage's task (greedy, never "
        "forced). Read a row to see what a stage changed; the diagonal is **plasticity** (each stage learns its own "
        "skill), the cells left of it are **stability** (does the model keep the earlier skills?). Hover a cell "
        "for its 95% interval and its change against the row above (exact McNemar p). Pick a second run beside it, "
        "e.g. the same preset with EWC off, to see forgetting and protection side by side."
    )
    with gr.Row(equal_height=False):
        other = gr.Dropdown(["", *studio.runs.run_ids(with_model=True)], value="", label="Beside it (optional): another run",
                            allow_custom_value=True, elem_id="matrix-other")
        n = gr.Number(50, label=f"N problems per task (1–{studio.limits.max_eval_n})", precision=None,
                      elem_id="matrix-n")
        go = gr.Button("Stage × task matrix", variant="secondary", elem_id="matrix-btn")
    progress_view = gr.HTML(elem_id="matrix-progress")
    heatmap = gr.Plot(show_label=False, elem_id="matrix-plot")
    note = gr.HTML(elem_id="matrix-note")

    @guard("compute the stage x task matrix")
    def on_matrix(run_id, other_id, n_problems, seed_value, request: gr.Request):
        skip = gr.skip()
        watcher = getattr(request, "session_hash", None) if request is not None else None
        try:
            job = studio.compare.submit_matrix(run_id, other_id, n_problems, seed_value, watcher=watcher)
        except FormError as e:
            yield _errors_html(e.errors), skip, skip
            return
        except QueueFullError as e:
            yield _errors_html([("queue", f"The evaluation queue is full: {e}")]), skip, skip
            return
        for now, html in follow_job(studio, job, watcher):
            if not now.finished:
                yield html, skip, skip
        job = now
        if job.status != DONE:
            yield html, skip, skip
            return
        found = job.result["runs"]
        titles = [(f"{rid} ({ewc_label(m)})", m) for rid, m in found]
        yield (render.job_progress_html(job.snapshot()), plot(matrix_figure(titles).to_json()),
               render.matrix_note_html(titles))

    go.click(on_matrix, [run, other, n, seed], [progress_view, heatmap, note], api_name="matrix",
             concurrency_id="compare", concurrency_limit=8, show_progress="minimal")
    return other


def _passk_update(figure_json):
    """The pass@k chart after a comparison: shown when it sampled answers ("" = it did not), else unchanged."""
    if figure_json is None:
        return gr.skip()
    if not figure_json:
        return gr.update(visible=False)
    return gr.update(value=plot(figure_json), visible=True)


def _errors_html(errors) -> str:
    return render.errors_html(errors, "Nothing was started:")
