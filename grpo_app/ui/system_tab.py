"""System tab: the machine (cores, threads, memory), package versions, and model sizes."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from grpo_app.core.system import system_info
from grpo_app.ui import render
from grpo_app.ui.common import guard
from grpo_app.ui.studio import Studio


@dataclass
class SystemTab:
    refresh_fn: object
    refresh_inputs: list
    refresh_outputs: list


def run_model_info(studio: Studio) -> dict | None:
    """Size of the current run's model, from its 'model_loaded' event (nothing is loaded for this)."""
    for ev in reversed(studio.view().get("events") or []):
        if ev.get("event") == "model_loaded":
            return {
                "model": ev.get("model"),
                "parameters": ev.get("parameters") or 0,
                "trainable": ev.get("trainable") or 0,
            }
    return None


def create_system_tab(studio: Studio) -> SystemTab:
    info = gr.Markdown(elem_id="system-info")
    refresh_btn = gr.Button("Refresh", elem_id="system-refresh")

    @guard("read the system information")
    def refresh():
        return render.system_md(system_info(), studio.models.loaded(), run_model_info(studio))

    refresh_btn.click(refresh, None, [info], api_name="system", concurrency_limit=None)
    return SystemTab(refresh_fn=refresh, refresh_inputs=[], refresh_outputs=[info])
