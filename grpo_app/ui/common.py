"""Small pieces the tabs share: ready Plotly JSON for gr.Plot, error slots, and a guard that turns
an unexpected exception into a short message on the page (the traceback goes to the server log)."""

from __future__ import annotations

import functools
import inspect
import logging

import gradio as gr
from gradio.components.plot import PlotData

from grpo_app.core.fileio import hide_server_paths

log = logging.getLogger("grpo_app.ui")


def plot(json_text: str | None):
    """A gr.Plot value from Plotly JSON built once by the studio (no per-page re-serialisation)."""
    return None if json_text is None else PlotData(type="plotly", plot=json_text)


def follow_job(studio, job, watcher, every: float = 0.5):
    """Watch a job of the evaluation queue: yields (job, progress HTML) each time the page's progress line
    changes, and last the finished job with its final line (the caller reads job.status / job.result)."""
    import time

    from grpo_app.ui import render

    last = None
    while True:
        job = studio.evals.get(job.id, watcher=watcher) or job
        html = render.job_progress_html(job.snapshot(), studio.evals.position(job), studio.manager.active)
        if job.finished:
            yield job, render.job_progress_html(job.snapshot())
            return
        if html != last:
            yield job, html
            last = html
        time.sleep(every)


def keep_pick(current, choices: list):
    """A run dropdown's refreshed choices (newest run first, or '' for none first). A refresh carries the value
    the page had when it was asked for (a tab click, a page load) and may land after the user picked another run,
    so a value that is still a choice is left as the page now has it (only the choices change); only a value that
    is gone is replaced, by the first choice."""
    if current in choices:
        return gr.update(choices=choices)
    return gr.update(choices=choices, value=choices[0] if choices else None)


def slot(messages: list[str] | None):
    """Update for a per-control error slot: visible with the messages, hidden when there are none."""
    if not messages:
        return gr.update(value="", visible=False)
    return gr.update(value="\n".join(f"⚠ {m}" for m in messages), visible=True)


def guard(what: str):
    """Decorator: an unexpected error becomes gr.Error('Could not <what>: <reason>') instead of a traceback."""

    def wrap(fn):
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def gen(*args, **kwargs):
                try:
                    yield from fn(*args, **kwargs)
                except gr.Error:
                    raise
                except Exception as e:  # noqa: BLE001
                    log.exception("%s failed", what)
                    raise gr.Error(f"Could not {what}: {_short(e)}") from None

            return gen

        @functools.wraps(fn)
        def plain(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except gr.Error:
                raise
            except Exception as e:  # noqa: BLE001
                log.exception("%s failed", what)
                raise gr.Error(f"Could not {what}: {_short(e)}") from None

        return plain

    return wrap


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return hide_server_paths(text)[:300]
