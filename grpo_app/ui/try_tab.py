"""Try tab: one question, two models, both answers streamed side by side and scored.

Both models decode greedily at the same time (`playground.stream_answers`); the extracted answer
and each reward function's score come from the same code as training and evaluation. Loaded models
stay in a small cache, so the second question is fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from grpo_app.core.models import ModelError
from grpo_app.evaluation.ask import finish, stream_answers
from grpo_app.ui import render
from grpo_app.ui.common import guard, keep_pick
from grpo_app.ui.forms import FormError
from grpo_app.ui.studio import Studio

MODES = [("A run vs its base model", "run"), ("Any two models", "models")]


@dataclass
class TryTab:
    refresh_fn: object
    refresh_inputs: list
    refresh_outputs: list


def create_try_tab(studio: Studio) -> TryTab:
    gr.Markdown(
        "Ask the model before and after training the same question. Both answer greedily (no sampling), "
        "token by token; below each answer: the number the graders read, and what each reward function pays."
    )
    with gr.Row(equal_height=False):
        mode = gr.Radio(MODES, value="run", label="Models", elem_id="try-mode")
        run = gr.Dropdown([], value=None, label="Run", allow_custom_value=True, elem_id="try-run")
        base = gr.Textbox("embedded", label="Model A", visible=False, max_lines=1, elem_id="try-base")
        trained = gr.Textbox(
            "", label="Model B (run id, hub id or folder)", visible=False, max_lines=1, elem_id="try-trained"
        )
    problems = studio.tryout.sample_problems()
    pick = gr.Dropdown(
        [(p["label"], i) for i, p in enumerate(problems)],
        value=None,
        label="Pick a problem (or type your own below)",
        elem_id="try-pick",
        allow_custom_value=True,
    )
    with gr.Row(equal_height=False):
        question = gr.Textbox(
            label="Question",
            lines=3,
            max_lines=10,
            elem_id="try-question",
            scale=4,
            placeholder="e.g. A baker makes 24 rolls and sells 15. How many are left?",
        )
        with gr.Column(scale=1, min_width=200):
            gold = gr.Textbox(label="Expected answer (optional)", max_lines=1, elem_id="try-gold")
            tokens = gr.Slider(
                16, studio.limits.max_try_tokens, value=192, step=8, label="Max answer tokens", elem_id="try-tokens"
            )
    with gr.Row():
        ask = gr.Button("Ask both models", variant="primary", elem_id="try-btn", scale=2)
        stop = gr.Button("Stop", elem_id="try-stop", scale=1)
    message = gr.HTML(elem_id="try-message")
    with gr.Row(equal_height=True):
        left = gr.HTML(render.answer_html("Base", "", None), elem_id="try-answer-base")
        right = gr.HTML(render.answer_html("Trained", "", None), elem_id="try-answer-trained")

    def on_mode(m):
        is_run = m == "run"
        return gr.update(visible=is_run), gr.update(visible=not is_run), gr.update(visible=not is_run)

    mode.change(on_mode, [mode], [run, base, trained], api_visibility="undocumented", show_progress="hidden")

    def on_pick(problem):
        try:
            p = problems[int(problem)]
        except (TypeError, ValueError, IndexError):
            return gr.skip(), gr.skip()
        return p["question"], p["answer"]

    pick.input(on_pick, [pick], [question, gold], api_name="pick_problem", show_progress="hidden")

    @guard("answer the question")
    def on_ask(mode, run, base, trained, question, expected_answer, max_tokens):
        skip = gr.skip()
        try:
            n_tokens = studio.tryout.check_try_input(question, expected_answer, max_tokens)
            setup = studio.tryout.try_models(mode, run, base, trained)
        except FormError as e:
            yield _errors_html(e.errors), skip, skip
            return
        titles, roles = setup["titles"], setup["roles"]
        yield (
            '<div class="job">Loading the models…</div>',
            render.answer_html(titles["base"], setup["labels"]["base"], None),
            render.answer_html(titles["trained"], setup["labels"]["trained"], None),
        )
        loaded = {}
        try:
            for role, name in roles.items():
                loaded[role] = studio.tryout.load_model(name)
        except ModelError as e:
            yield _errors_html([("model", str(e))]), skip, skip
            return
        labels = {role: loaded[role][2].label for role in roles}
        snap = None
        for snap in stream_answers(loaded, question.strip(), setup["system_prompt"], n_tokens):
            yield (
                '<div class="job">Generating…</div>',
                render.answer_html(titles["base"], labels["base"], snap["base"]),
                render.answer_html(titles["trained"], labels["trained"], snap["trained"]),
            )
        gold_text = None if expected_answer is None else str(expected_answer)
        finals = {role: finish(snap[role]["text"], gold_text, setup["weights"], question=question.strip(),
                             funcs=setup.get("funcs")) for role in roles}
        yield (
            "",
            render.answer_html(titles["base"], labels["base"], snap["base"], finals["base"]),
            render.answer_html(titles["trained"], labels["trained"], snap["trained"], finals["trained"]),
        )

    event = ask.click(
        on_ask,
        [mode, run, base, trained, question, gold, tokens],
        [message, left, right],
        api_name="try",
        concurrency_id="try",
        concurrency_limit=2,
        show_progress="hidden",
    )
    question.submit(
        on_ask,
        [mode, run, base, trained, question, gold, tokens],
        [message, left, right],
        api_visibility="undocumented",
        concurrency_id="try",
        concurrency_limit=2,
        show_progress="hidden",
    )
    stop.click(None, None, None, cancels=[event], api_visibility="undocumented")

    def refresh(current):
        ids = studio.runs.run_ids(with_model=True)
        return keep_pick(current, ids)

    return TryTab(refresh_fn=refresh, refresh_inputs=[run], refresh_outputs=[run])


def _errors_html(errors) -> str:
    return render.errors_html(errors, "Not asked:")
