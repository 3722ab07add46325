"""Train tab: the settings form, Start / Stop / Resume, the live status line and charts, and
"Inside a GRPO step".

Every page polls with a gr.Timer. A tick reads the studio's shared view (recomputed at most twice
a second for all pages) and sets the status line and two change markers; when the step marker moved,
the page makes **one** more request (the draw) that brings everything a new step changes: the step
charts, the run log, the latest GRPO step and the What-if box's numbers for it; the memory chart has
its own, slower marker. The figures, the status line and the run log are built once per change for
everybody, and the figures carry `uirevision` so a redraw keeps the viewer's zoom. A page opened (or
reloaded) during a run gets the whole history on its first tick. The tick and the draws are frontend
events that fetch plain routes of the server, not Gradio requests (`live.py`: a Gradio request cost the
server 5-20 ms of CPU taken from the training's cores, a plain route a fraction of that). Each tick's
answer also sets the page's timer: with many pages watching, the server asks each to poll less often
(`pacing.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from grpo_app.core.config import GSM8K_MODES, LOSS_TYPES, SCALE_REWARDS
from grpo_app.ui import render
from grpo_app.ui.choices import PageChoices
from grpo_app.ui.common import guard, slot
from grpo_app.ui.forms import REWARD_HEADERS, SLOTS, STAGE_HEADERS, FormError, TrainForm
from grpo_app.ui.live import DRAW_JS, MEMORY_JS, POLL_JS, LiveView, group_index, page_of
from grpo_app.ui.pacing import PollPacer, budget_from_env, max_period_from_env
from grpo_app.ui.studio import TRAIN_CHARTS, Studio

GSM8K_CHOICES = [
    ("auto — GSM8K from the local copy or the hub; generated look-alikes if neither is there", "auto"),
    ("local — only the local GSM8K folder", "local"),
    ("hub — download GSM8K from Hugging Face", "hub"),
    ("offline — never GSM8K; generated look-alike word problems", "offline"),
]
assert [v for _, v in GSM8K_CHOICES] == list(GSM8K_MODES)

LOSS_HELP = (
    "How token losses are averaged: dapo (default) over every answer token of the step; grpo per answer, then "
    "over answers (favours short right answers); dr_grpo by a constant (the length budget); bnpo per micro-batch."
)
REWARDS_HELP = (
    "Each row pays 1 when its rule holds, times its weight. **rule**: `answer_within` (value: the tolerance, e.g. "
    "0.5), `regex` (value: a pattern of up to 200 characters; must: match or absent; time-limited), `word` (value: "
    "a word; must: present or absent), `length` (value: min-max tokens, e.g. 10-60). Names: lower-case letters, "
    "digits and _. No code runs; Python rewards (`rewards.functions`) are for the command line."
)
SCALE_HELP = (
    "group: advantages divided by the group's std (GRPO); batch: by the whole step's std (PPO Lite); none: not "
    "divided (Dr. GRPO: no extra push for groups whose rewards barely differ). What if? shows all three."
)
STAGES_HELP = (
    "One row per curriculum stage, trained in order. **source**: `arithmetic` (generated sums; difficulty = "
    "number of operators, 1–5), `word` (generated word problems: a short story with one addition or subtraction, "
    "difficulty 2 = two of them, operators `*/` = equal groups), `gsm8k` (grade-school word problems; difficulty = calculation steps, mostly 2–4), "
    "`gsm_symbolic` (generated GSM8K-like word problems), `custom` (your uploaded file). Add or delete rows as you like. "
    "The last three may stay blank: a stage's own **learning rate** and **EWC λ** (blank = the run's), and "
    "**replay**, the share of its problems taken from earlier stages (0–0.9; blank = none)."
)


@dataclass
class TrainTab:
    studio: Studio
    inputs: list
    tick_outputs: list
    tick_inputs: list
    pacer: PollPacer
    live: LiveView

    def attach_load(self, demo: gr.Blocks) -> None:
        """A page's first tick when it opens (then its timer's)."""
        demo.load(None, self.tick_inputs, self.tick_outputs, js=POLL_JS, show_progress="hidden")


def create_train_tab(studio: Studio, timer_s: float = 1.5) -> TrainTab:
    presets = list(studio.presets)
    try:
        values, description = studio.train.preset_form(studio.default_preset)
    except FormError as e:  # a broken preset file must not take the page down
        values, description = {}, f"Preset problem: {e}"
    v = values.get

    with gr.Accordion("Settings", open=True, elem_id="train-settings"):
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=260):
                preset = gr.Dropdown(
                    presets,
                    value=studio.default_preset or None,
                    label="Preset",
                    elem_id="preset",
                    info="Fills every setting below; change any of them before starting.",
                )
                preset_desc = gr.Markdown(description or "", elem_id="preset-description")
                err_preset = gr.Markdown(visible=False, elem_classes="field-error")
            with gr.Column(scale=1, min_width=260):
                model = gr.Textbox(
                    value=v("model", "embedded"),
                    label="Model",
                    elem_id="model",
                    max_lines=1,
                    info="'embedded' (SmolLM2-135M, works offline), a hub id like owner/name, a run id, or a model folder under models/.",
                )
                err_model = gr.Markdown(visible=False, elem_classes="field-error")
            with gr.Column(scale=1, min_width=260):
                gsm8k = gr.Dropdown(
                    GSM8K_CHOICES, value=v("gsm8k", "auto"), label="Data source (GSM8K)", elem_id="data-source"
                )
                err_data = gr.Markdown(visible=False, elem_classes="field-error")
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=300):
                upload = gr.File(
                    label="Your own problems: a JSONL or CSV file with question and answer columns (used by stages with source 'custom')",
                    file_types=[".jsonl", ".csv"],
                    type="filepath",
                    elem_id="upload",
                    height=150,
                )
            with gr.Column(scale=1, min_width=260):
                upload_msg = gr.Markdown(
                    f"Up to {studio.limits.max_upload_mb} MB. Each row needs a question and a numeric answer "
                    "(or a worked solution ending in `#### <number>`).",
                    elem_id="upload-message",
                )
                err_upload = gr.Markdown(visible=False, elem_classes="field-error", elem_id="upload-error")
        stages = gr.Dataframe(
            value=v("stages", [["stage1", "arithmetic", 1, 1, 10, "", "", ""]]),
            headers=STAGE_HEADERS,
            datatype=["str", "str", "number", "number", "number", "str", "str", "str"],
            column_count=len(STAGE_HEADERS),
            type="array",
            interactive=True,
            label="Curriculum stages",
            elem_id="stages",
        )
        gr.Markdown(STAGES_HELP, elem_classes="help")
        err_stages = gr.Markdown(visible=False, elem_classes="field-error", elem_id="stages-error")
        with gr.Row(equal_height=False):
            with gr.Column(min_width=150):
                num_generations = gr.Number(
                    v("num_generations", 8),
                    label="G: completions per prompt",
                    precision=None,
                    elem_id="num-generations",
                )
                err_g = gr.Markdown(visible=False, elem_classes="field-error")
            with gr.Column(min_width=150):
                prompts_per_step = gr.Number(
                    v("prompts_per_step", 4), label="Prompts per step", precision=None, elem_id="prompts-per-step"
                )
                err_prompts = gr.Markdown(visible=False, elem_classes="field-error")
            with gr.Column(min_width=150):
                max_completion_length = gr.Number(
                    v("max_completion_length", 96),
                    label="Completion length (tokens)",
                    precision=None,
                    elem_id="completion-length",
                )
                err_len = gr.Markdown(visible=False, elem_classes="field-error")
            with gr.Column(min_width=150):
                learning_rate = gr.Textbox(
                    v("learning_rate", "1e-05"), label="Learning rate", max_lines=1, elem_id="learning-rate"
                )
                err_lr = gr.Markdown(visible=False, elem_classes="field-error")
            with gr.Column(min_width=150):
                seed = gr.Number(v("seed", 42), label="Seed", precision=None, elem_id="seed")
                err_seed = gr.Markdown(visible=False, elem_classes="field-error")
            with gr.Column(min_width=150):
                run_name = gr.Textbox(v("run_name", ""), label="Run name (optional)", max_lines=1, elem_id="run-name")
                err_name = gr.Markdown(visible=False, elem_classes="field-error")
        with gr.Row(equal_height=False):
            with gr.Column(min_width=200):
                ewc = gr.Checkbox(
                    v("ewc", True), label="EWC: protect what earlier stages learned (Fisher penalty)", elem_id="ewc"
                )
                ewc_lam = gr.Number(v("ewc_lam", 1000.0), label="EWC λ (strength)", precision=None, elem_id="ewc-lambda")
                err_ewc = gr.Markdown(visible=False, elem_classes="field-error")
            with gr.Column(min_width=200):
                loss_type = gr.Dropdown(
                    list(LOSS_TYPES), value=v("loss_type", "dapo"), label="Loss type (TRL's loss_type)",
                    info=LOSS_HELP, elem_id="loss-type",
                )
                scale_rewards = gr.Dropdown(
                    list(SCALE_REWARDS), value=v("scale_rewards", "group"), label="Advantage scaling (scale_rewards)",
                    info=SCALE_HELP, elem_id="scale-rewards",
                )
                err_loss = gr.Markdown(visible=False, elem_classes="field-error")
            with gr.Column(min_width=200):
                lora = gr.Checkbox(
                    v("lora", False), label="LoRA: train small adapters instead of all weights", elem_id="lora"
                )
                err_lora = gr.Markdown(visible=False, elem_classes="field-error")

    with gr.Accordion("Rewards of your own (no code): a name, a weight and one rule", open=False,
                      elem_id="custom-rewards-box"):
        custom_rewards = gr.Dataframe(
            value=v("custom_rewards", []),
            headers=REWARD_HEADERS,
            datatype=["str", "number", "str", "str", "str"],
            column_count=len(REWARD_HEADERS),
            type="array",
            interactive=True,
            label="Rewards of your own (added to the preset's)",
            elem_id="custom-rewards",
        )
        gr.Markdown(REWARDS_HELP, elem_classes="help")
        err_rewards = gr.Markdown(visible=False, elem_classes="field-error", elem_id="custom-rewards-error")

    with gr.Accordion("Preview: this run's config.yaml and the same run from a terminal", open=False, elem_id="preview-box"):
        preview_btn = gr.Button("Show what Start would run", elem_id="preview-btn", size="sm")
        preview_msg = gr.Markdown(elem_id="preview-message")
        preview_cmd = gr.Code(
            language="shell", label="Command (copy it)", interactive=False, elem_id="preview-command", max_lines=12
        )
        preview_yaml = gr.Code(language="yaml", label="config.yaml", interactive=False, elem_id="preview-yaml", max_lines=40)

    with gr.Row():
        start_btn = gr.Button("Start training", variant="primary", elem_id="start-btn", scale=2)
        stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=1)
        resume_btn = gr.Button("Resume", variant="secondary", elem_id="resume-btn", scale=1)
    message = gr.Markdown(elem_id="train-message")
    status = gr.HTML(render.status_html({}), elem_id="status")

    with gr.Row(equal_height=True):
        reward_plot = gr.Plot(show_label=False, elem_id="chart-reward")
        loss_plot = gr.Plot(show_label=False, elem_id="chart-loss")
    with gr.Row(equal_height=True):
        length_plot = gr.Plot(show_label=False, elem_id="chart-length")
        throughput_plot = gr.Plot(show_label=False, elem_id="chart-throughput")
    with gr.Row(equal_height=True):
        memory_plot = gr.Plot(show_label=False, elem_id="chart-memory")
        events_md = gr.Markdown(elem_id="run-events")

    gr.Markdown(
        "## Inside a GRPO step\nFor the latest step: one prompt, the G completions the model sampled for it, what each "
        "reward function paid, and the **advantage** that decides which completions are made more likely."
    )
    group = gr.Dropdown(
        choices=[], value=None, label="Prompt of this step", allow_custom_value=True, elem_id="step-group"
    )
    step_view = gr.HTML(render.step_html(None), elem_id="grpo-step")
    picked = PageChoices()  # each page's prompt and What-if choices, as the server last heard them (ui/choices.py)
    # the page's own random id (set by its first tick, ui/live.py): the What-if box's events send it, so that
    # the server keeps each page's choices apart
    page_id = gr.Textbox(visible=False, elem_id="page-id")
    what_if = _create_what_if(studio, group, picked, page_id)
    # change markers (hidden; see the tick): each one's .change draws its part
    step_mark, memory_mark = (gr.Textbox(visible=False, elem_id=f"mark-{k}") for k in ("step", "mem"))

    # (named as the config names them: one name per setting from the YAML key to the trainer)
    form_inputs = [preset, model, gsm8k, upload, stages, num_generations, max_completion_length, prompts_per_step,
                   learning_rate, ewc, ewc_lam, lora, seed, run_name, loss_type, scale_rewards, custom_rewards]
    slot_components = {
        "preset": err_preset,
        "model": err_model,
        "data": err_data,
        "upload": err_upload,
        "stages": err_stages,
        "num_generations": err_g,
        "prompts_per_step": err_prompts,
        "max_completion_length": err_len,
        "learning_rate": err_lr,
        "ewc": err_ewc,
        "lora": err_lora,
        "seed": err_seed,
        "run_name": err_name,
        "loss": err_loss,
        "rewards": err_rewards,
    }
    assert set(slot_components) == set(SLOTS)
    slot_outputs = [slot_components[s] for s in SLOTS]
    plots = {
        "reward": reward_plot,
        "loss": loss_plot,
        "length": length_plot,
        "memory": memory_plot,
        "throughput": throughput_plot,
    }
    steps_plots = [plots[k] for k in TRAIN_CHARTS if k != "memory"]
    # The timer's value is the poll period: each tick answers with the period the server wants now
    # (ui/pacing.py: many pages poll less often, so they cannot starve the server or the training).
    timer = gr.Timer(timer_s)
    pacer = PollPacer(timer_s, budget_from_env(), max_s=max(max_period_from_env(), timer_s))
    live = LiveView(
        studio, pacer, picked, what_if.sync, what_if.n_weights, [k for k in TRAIN_CHARTS if k != "memory"], timer_s
    )
    tick_outputs = [status, step_mark, memory_mark, timer, page_id]

    # ---- the tick, the draw, the memory chart: the page asks plain routes, not Gradio (ui/live.py) -------
    # The tick sets the status line and two change markers; each marker is a hidden Textbox whose .change
    # (fired only when its value changed) draws its part: everything a new step changes (one request: charts,
    # run log, the step's prompt picker and table, the What-if box), and the memory chart.
    quiet = dict(show_progress="hidden", trigger_mode="always_last")
    timer.tick(None, [page_id], tick_outputs, js=POLL_JS, **quiet)
    step_mark.change(
        None,
        [page_id, group, *what_if.inputs],
        [*steps_plots, events_md, group, step_view, *what_if.outputs],
        js=DRAW_JS,
        **quiet,
    )
    memory_mark.change(None, [page_id], [memory_plot], js=MEMORY_JS, **quiet)

    @guard("show that prompt")
    def pick_group(page, prompt):
        picked.remember(page_of(page), group=group_index(prompt))
        view = studio.view()
        return render.step_html(view.get("latest_step"), group_index(prompt))

    # the What-if box follows the picker through its own group.input listener (`_create_what_if`)
    group.input(pick_group, [page_id, group], [step_view], api_name="step_group", show_progress="hidden", concurrency_limit=None)

    # ---- actions ---------------------------------------------------------------------------------
    @guard("start training")
    def on_start(
        preset,
        model,
        data_source,
        upload,
        stages,
        num_generations,
        completion_length,
        prompts_per_step,
        learning_rate,
        ewc,
        ewc_lam,
        lora,
        seed,
        run_name,
        loss_type="",
        scale_rewards="",
        custom_rewards=None,
    ):
        form = page_form(preset, model, data_source, stages, num_generations, completion_length, prompts_per_step,
                         learning_rate, ewc, ewc_lam, lora, seed, run_name, loss_type, scale_rewards, custom_rewards)
        res = studio.train.start(form, upload)
        return [res.message, *[slot(res.errors.get(s)) for s in SLOTS]]

    start_btn.click(
        on_start, form_inputs, [message, *slot_outputs], api_name="start", concurrency_id="train_control"
    ).then(None, [page_id], tick_outputs, js=POLL_JS, show_progress="hidden")

    @guard("preview the run")
    def on_preview(preset, model, data_source, upload, stages, num_generations, completion_length, prompts_per_step,
                   learning_rate, ewc, ewc_lam, lora, seed, run_name, loss_type="", scale_rewards="",
                   custom_rewards=None):
        from grpo_app.ui.preview import preview

        form = page_form(preset, model, data_source, stages, num_generations, completion_length, prompts_per_step,
                         learning_rate, ewc, ewc_lam, lora, seed, run_name, loss_type, scale_rewards, custom_rewards)
        try:
            text, command = preview(studio, form, upload)
        except FormError as e:
            lines = "\n".join(f"- {m}" for _, m in e.errors)
            return f"**Nothing to preview — fix these settings first:**\n{lines}", "", ""
        notes = "".join(f"\n\nNote: {n}" for n in form.notes)
        msg = "Start would run exactly this; the command below does the same from a terminal in the project folder."
        return msg + notes, command, text

    preview_btn.click(
        on_preview, form_inputs, [preview_msg, preview_cmd, preview_yaml], api_name="preview", concurrency_limit=None
    )

    @guard("stop training")
    def on_stop():
        return studio.train.stop().message

    stop_btn.click(on_stop, None, [message], api_name="stop", concurrency_limit=None).then(
        None, [page_id], tick_outputs, js=POLL_JS, show_progress="hidden"
    )

    @guard("resume training")
    def on_resume():
        return studio.train.resume(None).message

    resume_btn.click(on_resume, None, [message], api_name="resume", concurrency_id="train_control").then(
        None, [page_id], tick_outputs, js=POLL_JS, show_progress="hidden"
    )

    @guard("load the preset")
    def on_preset(preset):
        try:
            vals, desc = studio.train.preset_form(preset)
        except FormError as e:
            return [gr.skip()] * 15 + [slot([m for _, m in e.errors])]
        return [
            desc,
            vals["model"],
            vals["gsm8k"],
            vals["stages"],
            vals["num_generations"],
            vals["max_completion_length"],
            vals["prompts_per_step"],
            vals["learning_rate"],
            vals["ewc"],
            vals["ewc_lam"],
            vals["lora"],
            vals["seed"],
            vals["loss_type"],
            vals["scale_rewards"],
            vals["custom_rewards"],
            slot(None),
        ]

    preset.input(
        on_preset,
        [preset],
        [preset_desc, model, gsm8k, stages, num_generations, max_completion_length, prompts_per_step, learning_rate,
         ewc, ewc_lam, lora, seed, loss_type, scale_rewards, custom_rewards, err_preset],
        api_name="preset",
    )

    @guard("check the uploaded file")
    def on_upload(file):
        if not file:
            return "", slot(None)
        try:
            _, msg = studio.train.check_upload(file)
        except FormError as e:
            return "", slot([m for _, m in e.errors])
        return msg, slot(None)

    upload.upload(on_upload, [upload], [upload_msg, err_upload], api_name="upload")
    upload.clear(lambda: ("", slot(None)), None, [upload_msg, err_upload], api_visibility="undocumented")

    gr.api(_status_api(studio), api_name="status", queue=False)

    return TrainTab(
        studio=studio, inputs=form_inputs, tick_outputs=tick_outputs, tick_inputs=[page_id], pacer=pacer, live=live
    )


WHAT_IF_HELP = (
    "GRPO never asks whether an answer is good in absolute terms: it compares each completion with the others "
    "of its group. Move a weight or shrink the group and the totals, the group's mean and std and every "
    "advantage are recomputed at once for this prompt, exactly as the trainer computes them (nothing is trained). "
    "Rewards the run did not use are scored now from the completions' text."
)


@dataclass
class WhatIfBox:
    """What the Train tab's per-step draw needs from the What-if box: `sync(view, group, choices, *inputs)` gives
    the `outputs` for a new step (the run's weights on the sliders when the run changed, else the page's
    `choices` from `PageChoices`, then the advantages) and the choices to remember (None when unchanged)."""

    inputs: list
    outputs: list
    sync: object
    n_weights: int


def _create_what_if(studio: Studio, group: gr.Dropdown, picked: PageChoices, page_id: gr.Textbox) -> WhatIfBox:
    """The "What if?" box under the step view: a slider per reward function and one for the group size; moving one
    recomputes the shown prompt's advantages (`advantages.what_if`), no model involved. A new step reaches it
    through the Train tab's one draw request (`WhatIfBox.sync`), not through a listener of its own."""
    from grpo_app.core.rewards import REWARD_FUNCS, reward_help
    from grpo_app.training.advantages import what_if

    names = list(REWARD_FUNCS)
    helps = reward_help()
    with gr.Accordion(
        "What if? Change the reward weights and see the advantages again", open=True, elem_id="what-if-box"
    ):
        gr.Markdown(WHAT_IF_HELP, elem_classes="help")
        with gr.Row(equal_height=False):
            sliders = [
                gr.Slider(
                    0,
                    2,
                    value=0,
                    step=0.05,
                    label=name,
                    info=helps.get(name, "")[:90],
                    elem_id=f"wi-{name}",
                    min_width=200,
                )
                for name in names
            ]
        with gr.Row(equal_height=False):
            size = gr.Slider(
                2, 64, value=8, step=1, label="Group size: keep the first n completions", elem_id="wi-size"
            )
            reset = gr.Button("Use the run's weights", elem_id="wi-reset", scale=0, min_width=200)
        out = gr.HTML(render.what_if_html(None, 0, None), elem_id="what-if")
    # the run whose weights the sliders were last set from (a hidden box, not a gr.State: the page's draw, which
    # does not go through Gradio, reads and sets it in the page, ui/live.py)
    applied = gr.Textbox(visible=False, elem_id="wi-applied")

    def current(view=None):
        view = view or studio.view()
        step = view.get("latest_step")
        if not step or not step.get("groups"):
            return view, None
        return view, step

    def scale_of(view, step) -> str:
        if step.get("scale_rewards"):
            return step["scale_rewards"]
        try:  # a step recorded before the snapshot carried it: the run's setting
            return studio.runs.get_run(view.get("run_id")).config().grpo.scale_rewards
        except Exception:  # noqa: BLE001 - TRL's default
            return "group"

    def recompute(step, view, g, n, weights) -> str:
        if step is None:
            return render.what_if_html(None, 0, None)
        # a run's rewards of its own have no slider: they keep the run's weight (recorded with the step)
        weights = {**{k: float(w) for k, w in (step.get("weights") or {}).items() if k not in names}, **weights}
        groups = step["groups"]
        g = min(group_index(g), len(groups) - 1)
        n = min(int(n or 2), len(groups[g].get("completions") or []))
        try:
            res = what_if(groups[g], weights, group_size=n, scale_rewards=scale_of(view, step), batch_groups=groups)
        except ValueError as e:
            return render.what_if_html(step, g, None, str(e))
        return render.what_if_html(step, g, res)

    @guard("recompute the advantages")
    def on_change(page, g, n, *values):
        version = picked.remember(page_of(page), group=group_index(g), size=n, weights=list(values))
        view, step = current()
        return render.stamp_what_if(recompute(step, view, g, n, dict(zip(names, values))), version)

    def sync(view, g, mine: dict, done, n, *values, force=False):
        """The box for the latest step: on a new run (or `force`), the run's reward weights and whole groups;
        else the weights and size the page chose last (`mine`, see ui/choices.py), or failing that the ones it
        sent. Returns (outputs, choices to remember or None); the caller stamps the table with the version of the
        choices (`render.stamp_what_if`)."""
        done = done or None  # the hidden box holds "" before its first run
        view, step = current(view)
        if step is None:
            return [done, *[gr.skip()] * len(names), gr.skip(), render.what_if_html(None, 0, None)], None
        big = max(len(x.get("completions") or []) for x in step["groups"])
        run_id = view.get("run_id")
        if force or done != run_id:
            w = {k: float(v) for k, v in (step.get("weights") or {}).items()}
            ups = [gr.update(value=w.get(k, 0.0), maximum=max(2.0, w.get(k, 0.0))) for k in names]
            values, n = [w.get(k, 0.0) for k in names], big
            box = [
                run_id,
                *ups,
                gr.update(value=big, maximum=big),
                recompute(step, view, g, n, dict(zip(names, values))),
            ]
            return box, {"run_id": run_id, "weights": values, "size": big}
        if mine.get("run_id") == run_id and len(mine.get("weights") or ()) == len(names):
            values, n = mine["weights"], mine.get("size", n)
        n = min(int(n or big), big)
        html = recompute(step, view, g, n, dict(zip(names, values)))
        # the same run: the sliders keep the page's values (sent back as plain values: an update or gr.skip() per
        # output made the per-step draw 30% dearer, 8.6 vs 6.6 ms of server time)
        return [done, *values, n, html], None

    inputs = [page_id, group, size, *sliders]
    for c in (*sliders, size):
        c.input(
            on_change, inputs, [out], api_visibility="undocumented", show_progress="hidden", trigger_mode="always_last"
        )
    group.input(on_change, inputs, [out], api_visibility="undocumented", show_progress="hidden")
    sync_out = [applied, *sliders, size, out]

    @guard("load the run's weights")
    def on_reset(page, g, done, n, *values):
        box, chosen = sync(None, g, {}, done, n, *values, force=True)
        page = page_of(page)
        version = picked.remember(page, **chosen) if chosen else picked.get(page).get("version", 0)
        return [*box[:-1], render.stamp_what_if(box[-1], version)]

    reset.click(
        on_reset,
        [page_id, group, applied, size, *sliders],
        sync_out,
        api_visibility="undocumented",
        show_progress="hidden",
    )
    gr.api(_what_if_api(studio), api_name="what_if", concurrency_limit=None)
    return WhatIfBox(inputs=[applied, size, *sliders], outputs=sync_out, sync=sync, n_weights=len(names))


def _what_if_api(studio: Studio):
    def what_if_api(weights: dict, group: int = 0, group_size: int = 0) -> dict:
        """The latest step's prompt `group` recomputed with other reward weights ({name: weight}) and only its
        first `group_size` completions (0 = all): totals, group mean and std, advantages (nothing is trained)."""
        from grpo_app.training.advantages import what_if

        step = studio.view().get("latest_step")
        if not step or not step.get("groups"):
            return {"error": "no step has been recorded yet."}
        groups = step["groups"]
        if not 0 <= int(group) < len(groups):
            return {"error": f"this step has prompts 0..{len(groups) - 1}."}
        try:
            res = what_if(
                groups[int(group)],
                {str(k): float(v) for k, v in (weights or {}).items()},
                group_size=int(group_size) or None,
                scale_rewards=step.get("scale_rewards") or "group",
                batch_groups=groups,
            )
        except (ValueError, TypeError) as e:
            return {"error": str(e)}
        return {k: res[k] for k in ("totals", "mean", "std", "advantages", "weights", "group_size", "computed")}

    return what_if_api


def page_form(preset, model, data_source, stages, num_generations, completion_length, prompts_per_step,
              learning_rate, ewc, ewc_lam, lora, seed, run_name, loss_type="", scale_rewards="",
              custom_rewards=None) -> TrainForm:
    """The Train form's controls, in the page's order, as the TrainForm that Start and Preview both check."""
    return TrainForm(
        preset=preset,
        model=model,
        gsm8k=data_source,
        stages=stages,
        num_generations=num_generations,
        max_completion_length=completion_length,
        prompts_per_step=prompts_per_step,
        learning_rate=learning_rate,
        ewc=ewc,
        ewc_lam=ewc_lam,
        lora=lora,
        seed=seed,
        run_name=run_name,
        loss_type=loss_type,
        scale_rewards=scale_rewards,
        custom_rewards=custom_rewards,
    )


def _status_api(studio: Studio):
    def status() -> dict:
        """The training run this server shows: state, stage, step, elapsed, ETA, tokens/s, latest reward."""
        return studio.train.status()

    return status
