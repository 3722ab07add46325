"""Runs tab: several runs side by side (their curves on shared charts, the settings in which they differ, a
leaderboard of their comparisons on the same problems), every run under the runs folder — status, preset, stages, final reward, duration — and,
for one run, its charts, its answers across training (one problem's sampled groups step by step, or one
step's groups, from steps.jsonl), its comparisons, its config.yaml, its trained model as a zip, an export
as GGUF or safetensors (with a model card) and its push to the Hugging Face Hub, Resume, and Delete (which
asks for the run id typed out, so nothing is deleted by a stray click)."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from grpo_app.export.downloads import model_download, zip_trained_model
from grpo_app.runs.job_queue import DONE, QueueFullError
from grpo_app.runs.monitor import resumable
from grpo_app.runs.side_by_side import MAX_RUNS, OVERLAY_METRICS
from grpo_app.ui import render
from grpo_app.ui.common import follow_job, guard, keep_pick, plot
from grpo_app.ui.forms import FormError
from grpo_app.ui.studio import TRAIN_CHARTS, Studio

EXPORT_CHOICES = [
    ("GGUF f16 — llama.cpp / Ollama", "gguf:f16"),
    ("GGUF q8_0 — about half the size of f16", "gguf:q8_0"),
    ("GGUF f32 — the trained numbers exactly", "gguf:f32"),
    ("safetensors f32 — transformers (zip)", "safetensors:f32"),
    ("safetensors f16 — transformers, half the size (zip)", "safetensors:f16"),
]


def _export_choice(choice) -> tuple[str, str]:
    from grpo_app.export.model_files import check_choice

    fmt, _, quant = str(choice or "").partition(":")
    return check_choice(fmt, quant)


def _export_label(choice) -> str:
    return next((label.split(" — ")[0] for label, value in EXPORT_CHOICES if value == choice), str(choice))


@dataclass
class RunsTab:
    refresh_fn: object
    refresh_inputs: list
    refresh_outputs: list


def create_runs_tab(studio: Studio) -> RunsTab:
    with gr.Row():
        refresh_btn = gr.Button("Refresh", elem_id="runs-refresh", scale=0, min_width=120)
    table = gr.Dataframe(
        headers=render.RUN_HEADERS,
        interactive=False,
        wrap=True,
        label="Runs (newest first)",
        elem_id="runs-table",
        max_height=420,
    )
    with gr.Row(equal_height=False):
        pick = gr.Dropdown([], value=None, label="Open a run", allow_custom_value=True, elem_id="runs-pick", scale=3)
        open_btn = gr.Button("Open", variant="primary", elem_id="runs-open", scale=1)
    with gr.Column(visible=False, elem_id="run-detail-box") as detail_box:
        with gr.Row(equal_height=False):
            details = gr.Markdown(elem_id="run-details")
            memory_plot = gr.Plot(show_label=False, elem_id="run-chart-memory")
        with gr.Row(equal_height=True):
            reward_plot = gr.Plot(show_label=False, elem_id="run-chart-reward")
            loss_plot = gr.Plot(show_label=False, elem_id="run-chart-loss")
        with gr.Row(equal_height=True):
            length_plot = gr.Plot(show_label=False, elem_id="run-chart-length")
            throughput_plot = gr.Plot(show_label=False, elem_id="run-chart-throughput")
        answers = _create_answers(studio)
        evals = gr.Dataframe(
            headers=render.EVAL_HEADERS,
            interactive=False,
            wrap=True,
            label="Comparisons of this run (Compare tab)",
            elem_id="run-evals",
        )
        with gr.Row(equal_height=False):
            download_btn = gr.Button("Prepare the trained model as a .zip", elem_id="runs-download")
            resume_btn = gr.Button("Resume this run", elem_id="runs-resume")
        zip_file = gr.File(label="Trained model", interactive=False, visible=False, elem_id="runs-zip")
        with gr.Accordion("config.yaml of this run", open=False, elem_id="run-config-box"):
            run_config = gr.Code(language="yaml", label="config.yaml", interactive=False, elem_id="run-config")
        with gr.Accordion("Export the trained model (GGUF for llama.cpp / Ollama, or safetensors)", open=False,
                          elem_id="runs-export-box"):
            with gr.Row(equal_height=False):
                export_choice = gr.Dropdown(
                    EXPORT_CHOICES, value="gguf:f16", label="Format", elem_id="runs-export-format", scale=3
                )
                export_btn = gr.Button("Export", elem_id="runs-export", scale=1)
            export_file = gr.File(label="Exported model", interactive=False, visible=False, elem_id="runs-export-file")
            with gr.Row(equal_height=False):
                hub_repo = gr.Textbox(label="Hub repo (owner/name)", max_lines=1, elem_id="runs-hub-repo", scale=2)
                hub_token = gr.Textbox(
                    label="Hugging Face write token (used for this push only, never stored)",
                    type="password",
                    max_lines=1,
                    elem_id="runs-hub-token",
                    scale=2,
                )
                hub_private = gr.Checkbox(True, label="private repo", elem_id="runs-hub-private", scale=1)
            push_btn = gr.Button("Push this export to the Hub", elem_id="runs-push")
        with gr.Accordion("Delete this run", open=False, elem_id="runs-delete-box"):
            confirm = gr.Textbox(label="Type the run id to confirm", max_lines=1, elem_id="runs-confirm")
            delete_btn = gr.Button("Delete run", variant="stop", elem_id="runs-delete")
    message = gr.Markdown(elem_id="runs-message")
    side = _create_side_by_side(studio)
    plots = {
        "reward": reward_plot,
        "loss": loss_plot,
        "length": length_plot,
        "memory": memory_plot,
        "throughput": throughput_plot,
    }
    plot_outputs = [plots[k] for k in TRAIN_CHARTS]

    @guard("list the runs")
    def refresh(current):
        ids = studio.runs.run_ids()
        # the newest run (the first) opens by itself
        return render.run_rows(studio.runs.run_summaries()), keep_pick(current, ids), gr.update(choices=ids)

    refresh_btn.click(refresh, [pick], [table, pick, side], api_name="runs", concurrency_limit=None,
                      show_progress="hidden")

    @guard("open the run")
    def on_open(run_id):
        hidden = [*[gr.skip()] * len(plot_outputs), gr.skip(), gr.update(visible=False)]
        if not run_id:
            return ["", *hidden]
        try:
            run = studio.runs.get_run(run_id)
        except FormError as e:
            return [f"⚠ {e.errors[0][1]}", *hidden]
        view = studio.runs.run_view(run)
        js = studio.train.chart_json(view)
        summary = run.summary()
        md = render.run_details_md(summary, view.get("events") or [])
        if resumable(run):
            md += "\n\nThis run can be resumed from its last checkpoint."
        evals_rows = render.eval_rows(studio.runs.run_evals(run))
        return [md, *[plot(js[k]) for k in TRAIN_CHARTS], evals_rows, gr.update(visible=True)]

    open_outputs = [details, *plot_outputs, evals, detail_box]
    open_btn.click(on_open, [pick], open_outputs, api_name="open_run", concurrency_limit=None).then(
        answers.init, [pick], answers.outputs, api_visibility="undocumented", show_progress="hidden"
    )
    pick.change(on_open, [pick], open_outputs, api_visibility="undocumented", concurrency_limit=None).then(
        answers.init, [pick], answers.outputs, api_visibility="undocumented", show_progress="hidden"
    )
    answers.wire(pick)

    def on_row(evt: gr.SelectData):
        row = getattr(evt, "row_value", None)
        if row:
            return row[0]
        ids = studio.runs.run_ids()
        try:
            return ids[evt.index[0]]
        except (TypeError, IndexError):
            return gr.skip()

    table.select(on_row, None, [pick], api_visibility="undocumented", concurrency_limit=None)

    @guard("prepare the download")
    def on_download(run_id):
        try:
            run = studio.runs.get_run(run_id)
            path = zip_trained_model(run)
        except FormError as e:
            return None, f"⚠ {e.errors[0][1]}"
        except FileNotFoundError as e:
            return None, f"⚠ {e}"
        size = path.stat().st_size / 2**20
        return str(path), f"The trained model of **{run.id}** is ready ({size:,.0f} MB)."

    download_btn.click(on_download, [pick], [zip_file, message], api_name="download", concurrency_limit=1).then(
        lambda f: gr.update(visible=bool(f)), [zip_file], [zip_file], api_visibility="undocumented"
    )

    @guard("show the run's config")
    def on_config(run_id):
        if not run_id:
            return ""
        try:
            run = studio.runs.get_run(run_id)
            return run.config_path.read_text(encoding="utf-8")
        except (FormError, OSError):
            return ""

    open_btn.click(on_config, [pick], [run_config], api_name="run_config", concurrency_limit=None)
    pick.change(on_config, [pick], [run_config], api_visibility="undocumented", concurrency_limit=None)

    @guard("export the model")
    def on_export(run_id, choice):
        from grpo_app.export.model_files import ExportError

        try:
            fmt, quant = _export_choice(choice)
            run = studio.runs.get_run(run_id)
            path, res = model_download(run, fmt, quant)
        except FormError as e:
            return None, f"⚠ {e.errors[0][1]}"
        except ExportError as e:
            return None, f"⚠ {e}"
        where = f"export/{res.fmt}-{res.quant}" + (f"/{res.path.name}" if res.fmt == "gguf" else "")
        msg = (
            f"Exported **{run.id}** as {_export_label(choice)} ({path.stat().st_size / 2**20:,.1f} MB, "
            f"{res.seconds:.0f} s); it is also kept in the run folder as `{where}`"
            + (", with its model card (README.md)." if res.fmt == "gguf" else " (the zip holds the model card, README.md).")
        )
        return str(path), msg + "".join(f"\n\nNote: {n}" for n in res.notes)

    export_btn.click(
        on_export, [pick, export_choice], [export_file, message], api_name="export_model", concurrency_id="export",
        concurrency_limit=1,
    ).then(lambda f: gr.update(visible=bool(f)), [export_file], [export_file], api_visibility="undocumented")

    @guard("push to the Hub")
    def on_push(run_id, choice, repo, token, private):
        from grpo_app.export.model_files import ExportError, default_out, push_to_hub

        try:
            fmt, quant = _export_choice(choice)
            run = studio.runs.get_run(run_id)
            folder = default_out(run, fmt, quant)
            shown = f"`export/{fmt}-{quant}` of run {run.id}"
            if not folder.is_dir():
                return f"⚠ Export **{run.id}** as {_export_label(choice)} first (the Export button); then push it."
            url = push_to_hub(folder, repo, token=token or None, private=bool(private), shown=shown)
        except FormError as e:
            return f"⚠ {e.errors[0][1]}"
        except ExportError as e:
            return f"⚠ {e}"
        return f"Pushed {shown} to [{url}]({url})."

    push_btn.click(
        on_push, [pick, export_choice, hub_repo, hub_token, hub_private], [message], api_name="push_model",
        concurrency_id="export", concurrency_limit=1,
    )

    @guard("resume the run")
    def on_resume(run_id):
        if not run_id:
            return "⚠ Pick a run first."
        return studio.train.resume(run_id).message

    resume_btn.click(on_resume, [pick], [message], api_name="resume_run", concurrency_id="train_control")

    @guard("delete the run")
    def on_delete(run_id, confirmation):
        res = studio.runs.delete_run(run_id, confirmation)
        ids = studio.runs.run_ids()
        if not res.ok:
            return f"⚠ {res.message}", gr.skip(), gr.skip(), gr.skip()
        return res.message, render.run_rows(studio.runs.run_summaries()), gr.update(choices=ids, value=None), ""

    delete_btn.click(on_delete, [pick, confirm], [message, table, pick, confirm], api_name="delete")

    return RunsTab(refresh_fn=refresh, refresh_inputs=[pick], refresh_outputs=[table, pick, side])


# ------------------------------------------------------------------------------------------------
# Answers across training
# ------------------------------------------------------------------------------------------------
ANSWERS_HELP = (
    "Every training step's prompts, sampled answers, rewards and advantages are kept in the run folder. Pick a "
    "problem and move the slider to see how the model's answers to it changed each time it was sampled, or pick "
    "*Every problem of one step* and move along the steps."
)


@dataclass
class AnswersView:
    init: object
    outputs: list
    wire: object


def _create_answers(studio: Studio) -> AnswersView:
    from grpo_app.runs.step_history import load_steps, problem_history, problems

    with gr.Accordion("Answers across training", open=True, elem_id="answers-box"):
        gr.Markdown(ANSWERS_HELP, elem_classes="help")
        with gr.Row(equal_height=False):
            problem = gr.Dropdown(
                [], value=None, label="Problem", allow_custom_value=True, elem_id="answers-problem", scale=2
            )
            pos = gr.Slider(1, 2, value=1, step=1, label="Time sampled", elem_id="answers-pos", scale=2)
        view = gr.HTML(elem_id="answers-view")
    outputs = [problem, pos, view]

    def steps_of(run_id):
        return load_steps(studio.runs.get_run(run_id))

    def draw(steps, key, at) -> str:
        if key:
            return render.answers_problem_html(problem_history(steps, key), at)
        at = max(1, min(int(at or 1), len(steps)))
        return render.answers_step_html(steps[at - 1] if steps else None, at, len(steps))

    def slider_for(steps, key, at=1):
        n = len(problem_history(steps, key)) if key else len(steps)
        label = "Time this problem was sampled" if key else "Recorded step"
        return gr.update(minimum=1, maximum=max(n, 2), value=max(1, min(at, n)), label=label, interactive=n > 1)

    @guard("show the answers across training")
    def init(run_id):
        empty = [gr.update(choices=[], value=None), gr.skip(), ""]
        if not run_id:
            return empty
        try:
            steps = steps_of(run_id)
        except FormError as e:
            return [empty[0], gr.skip(), f"⚠ {render._e(e.errors[0][1])}"]
        if not steps:
            return [
                empty[0],
                gr.skip(),
                '<div class="gs gs-empty">No step history in this run yet (steps.jsonl is written from the first '
                "training step on; runs from before it existed keep only their latest step).</div>",
            ]
        ps = problems(steps)
        key = ps[0]["key"]
        return [gr.update(choices=render.answers_choices(ps), value=key), slider_for(steps, key), draw(steps, key, 1)]

    def wire(pick):
        @guard("show that problem")
        def on_problem(run_id, key):
            steps = steps_of(run_id)
            return slider_for(steps, key or ""), draw(steps, key or "", 1)

        @guard("show that step")
        def on_pos(run_id, key, at):
            return draw(steps_of(run_id), key or "", at)

        problem.input(on_problem, [pick, problem], [pos, view], api_name="answers_problem", concurrency_limit=None)
        pos.input(
            on_pos,
            [pick, problem, pos],
            [view],
            api_name="answers_step",
            concurrency_limit=None,
            trigger_mode="always_last",
        )

    return AnswersView(init=init, outputs=outputs, wire=wire)


def _create_side_by_side(studio: Studio):
    """Runs side by side (issue 44): 2-8 runs' reward, answer-length, EWC-penalty and memory curves on shared
    charts, the settings in which they differ, and a leaderboard of their Compare results on the same problems,
    scoring the missing runs on request. Returns the run picker (the tab's refresh fills its choices)."""

    with gr.Accordion("Runs side by side: a class's experiments on shared charts, with a leaderboard", open=False,
                      elem_id="side-box"):
        gr.Markdown(
            f"Pick 2 to {MAX_RUNS} runs (e.g. one group's run with EWC and another's without, or G = 4 against "
            "G = 16). Each run gets one colour on every chart; hover a point for its run, stage and step. The table "
            "lists only the settings in which the runs differ; the leaderboard ranks their trained models on the "
            "same problems."
        )
        with gr.Row(equal_height=False):
            picked = gr.Dropdown([], value=[], multiselect=True, max_choices=MAX_RUNS, label="Runs", scale=4,
                                 elem_id="side-runs")
            board_set = gr.Dropdown([], value=None, label="Leaderboard problem set", allow_custom_value=True, scale=2,
                                    elem_id="side-set")
            go = gr.Button("Side by side", variant="primary", scale=1, elem_id="side-btn")
        note = gr.HTML(elem_id="side-note")
        with gr.Row(equal_height=True):
            reward_plot = gr.Plot(show_label=False, elem_id="side-chart-reward")
            length_plot = gr.Plot(show_label=False, elem_id="side-chart-length")
        with gr.Row(equal_height=True):
            ewc_plot = gr.Plot(show_label=False, elem_id="side-chart-ewc")
            memory_plot = gr.Plot(show_label=False, elem_id="side-chart-memory")
        diff = gr.Dataframe(interactive=False, wrap=True, label="Settings in which they differ", elem_id="side-diff")
        board = gr.Dataframe(headers=render.BOARD_HEADERS, interactive=False, wrap=True, label="Leaderboard",
                             elem_id="side-board")
        board_note = gr.HTML(elem_id="side-board-note")
        with gr.Row(equal_height=False):
            n = gr.Number(100, label=f"N GSM8K test problems (1–{studio.limits.max_eval_n})", precision=None,
                          elem_id="side-n")
            score_btn = gr.Button("Score the missing runs", elem_id="side-score")
        progress_view = gr.HTML(elem_id="side-progress")
    plots = {"reward": reward_plot, "length": length_plot, "ewc": ewc_plot, "memory": memory_plot}

    @guard("put the runs side by side")
    def on_side(run_ids, set_name):
        skip = [gr.skip()] * (len(plots) + 4)
        try:
            res = studio.runs.side_by_side(run_ids, set_name)
        except FormError as e:
            return [_errors(e.errors), *skip]
        sets = [(f"{name} ({k} of {len(res['runs'])} runs)", name) for name, k in res["sets"]]
        return [
            "",
            *[plot(res["charts"][k]) for k in OVERLAY_METRICS],
            render.diff_table(res["diff"], res["runs"]),
            render.board_rows(res["board"]),
            render.board_note_html(res["board"]),
            gr.update(choices=sets or [(res["board"]["set"], res["board"]["set"])], value=res["board"]["set"]),
        ]

    outputs = [note, *[plots[k] for k in OVERLAY_METRICS], diff, board, board_note, board_set]
    go.click(on_side, [picked, board_set], outputs, api_name="side_by_side", concurrency_limit=4)

    @guard("score the missing runs")
    def on_score(run_ids, n_problems, request: gr.Request):
        watcher = getattr(request, "session_hash", None) if request is not None else None
        skip = [gr.skip()] * 4
        try:
            job = studio.runs.submit_score_missing(run_ids, n_problems, 0, watcher=watcher)
        except FormError as e:
            yield [_errors(e.errors), *skip]
            return
        except QueueFullError as e:
            yield [_errors([("queue", f"The evaluation queue is full: {e}")]), *skip]
            return
        for now, html in follow_job(studio, job, watcher):
            if not now.finished:
                yield [html, *skip]
        job = now
        if job.status != DONE:
            yield [html, *skip]
            return
        res = studio.runs.side_by_side(run_ids, job.result["set"])
        yield [render.job_progress_html(job.snapshot()), render.board_rows(res["board"]),
               render.board_note_html(res["board"]),
               gr.update(choices=[(f"{s} ({k} of {len(res['runs'])} runs)", s) for s, k in res["sets"]],
                         value=res["board"]["set"]),
               gr.skip()]

    score_btn.click(on_score, [picked, n], [progress_view, board, board_note, board_set, note],
                    api_name="side_score", concurrency_id="compare", concurrency_limit=8, show_progress="minimal")
    return picked


def _errors(errors) -> str:
    return render.errors_html(errors, "Nothing was done:")
