"""The web app: one Gradio Blocks page with the Train, Compare, Try, Runs and System tabs.

`build_app()` assembles the tabs around one shared `Studio` (the training job, the evaluation
queue, the model cache). `main()` serves it: localhost:7860 by default, 0.0.0.0 on a Hugging Face
Space (SPACE_ID is set), GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override both. Optional login
with GRPO_APP_USERNAME / GRPO_APP_PASSWORD. Ctrl-C (SIGINT) or SIGTERM stops a running training at
the step in progress (kept: the checkpoint of the last complete step) before the process exits; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from grpo_app.core.env import env_int  # noqa: E402
from grpo_app.core.system import quiet_libraries  # noqa: E402
from grpo_app.runs.manager import RunManager  # noqa: E402
from grpo_app.ui.compare_tab import create_compare_tab  # noqa: E402
from grpo_app.ui.live import serve_routes  # noqa: E402
from grpo_app.ui.pacing import max_period_from_env  # noqa: E402
from grpo_app.ui.runs_tab import create_runs_tab  # noqa: E402
from grpo_app.ui.studio import Limits, Studio  # noqa: E402
from grpo_app.ui.system_tab import create_system_tab  # noqa: E402
from grpo_app.ui.train_tab import create_train_tab  # noqa: E402
from grpo_app.ui.try_tab import create_try_tab  # noqa: E402

log = logging.getLogger("grpo_app.ui")

TITLE = "CPU GRPO Studio"
INTRO = (
    "Teach a small language model grade-school math with **GRPO** (group relative policy optimization), "
    "on this computer's CPU, and measure honestly whether it learned. **Train** runs a curriculum and shows "
    "every step live; **Compare** scores base vs trained on the same problems; **Try** asks both the same "
    "question; **Runs** keeps the history."
)

CSS = """
.gradio-container { max-width: 1500px !important; font-size: 16px; }
#app-title h1 { margin-bottom: 0; }
.field-error, .field-error p { color: #b3261e !important; font-weight: 600; font-size: 0.95em; margin: 0; }
.status-line { font-size: 1.15em; padding: 8px 12px; border-radius: 8px; background: #f4f6f8; line-height: 1.8; }
.status-line .run-id { font-family: ui-monospace, monospace; font-weight: 600; }
.status-line .phase { color: #555; font-style: italic; }
.status-error { color: #b3261e; font-weight: 600; padding: 4px 12px; }
.status-note { color: #333; padding: 4px 12px; }
.badge { color: #fff; border-radius: 12px; padding: 2px 10px; font-weight: 600; }
.gs { font-size: 1.0em; }
.gs-head { font-size: 1.1em; margin-bottom: 6px; }
.gs-q { background: #f4f6f8; border-radius: 8px; padding: 8px 12px; margin-bottom: 8px; }
.gs-gold { margin-top: 4px; }
.gs-table { width: 100%; border-collapse: collapse; }
.gs-table th, .gs-table td { border-bottom: 1px solid #ddd; padding: 4px 8px; vertical-align: top; }
.gs-table th { background: #eef1f4; text-align: center; }
.gs-table td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.gs-table td.adv { font-weight: 700; text-align: center; }
.gs-table .comp-text { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 0.9em;
  max-height: 9em; overflow-y: auto; }
.gs-foot td { background: #fafafa; }
mark.forced { background: #f3d9ff; color: #4a136b; outline: 1px dashed #8e44ad; }
.forced-tag { font-family: system-ui, sans-serif; font-size: 0.8em; color: #6c2a8f; background: #f3e5fa;
  border-radius: 6px; padding: 0 4px; white-space: nowrap; }
.gs-note, .gs-empty { color: #444; margin-top: 8px; }
.wi-head, .ans-head { background: #fff8e6; border-radius: 8px; padding: 8px 12px; margin: 6px 0; }
.wi-table { margin-top: 8px; }
.wi-comp { font-family: ui-monospace, monospace; font-size: 0.85em; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; max-width: 40em; }
.ans-trend { width: auto; margin-bottom: 10px; }
.ans-trend tr.ans-now td { background: #e8f1fa; font-weight: 700; }
.ans .gs { border-top: 2px solid #ddd; padding-top: 8px; margin-top: 8px; }
.cards { display: flex; gap: 16px; flex-wrap: wrap; }
.card { flex: 1 1 280px; border: 1px solid #ddd; border-radius: 10px; padding: 12px 16px; background: #fff; }
.card-title { font-weight: 700; font-size: 1.1em; }
.card-model { color: #666; font-size: 0.9em; word-break: break-all; }
.card-big { font-size: 2.4em; font-weight: 700; }
.card-ci, .card-sub { color: #444; }
.paired, .origin { margin-top: 10px; }
.origin { color: #666; font-size: 0.9em; }
.job .bar { height: 14px; background: #e6e9ec; border-radius: 7px; overflow: hidden; margin: 6px 0; }
.job .fill { height: 100%; background: #0072B2; transition: width 0.4s; }
.job-bad { color: #b3261e; font-weight: 600; }
.answer { border: 1px solid #ddd; border-radius: 10px; padding: 10px 14px; min-height: 8em; background: #fff; }
.answer-title { font-weight: 700; font-size: 1.1em; }
.answer-model { color: #666; font-size: 0.85em; word-break: break-all; }
.answer-text { white-space: pre-wrap; font-family: ui-monospace, monospace; margin: 8px 0; max-height: 22em; overflow-y: auto; }
.answer-meta { color: #666; font-size: 0.9em; }
.answer-pred { margin-top: 6px; font-size: 1.05em; }
.answer .ok { color: #00794f; font-weight: 700; }
.answer .bad { color: #b3261e; font-weight: 700; }
.rew { margin-top: 6px; border-collapse: collapse; }
.rew td, .rew th { padding: 2px 10px; border-bottom: 1px solid #eee; }
.rew td.num { text-align: right; }
.rew .total td { font-weight: 700; }
"""


def build_app(
    manager: RunManager | None = None,
    runs_dir: str | Path | None = None,
    configs_dir: str | Path | None = None,
    default_preset: str | None = None,
    studio: Studio | None = None,
    timer_s: float | None = None,
) -> gr.Blocks:
    """The whole page. Pass a `manager` (or `runs_dir`) to share a RunManager, or a ready `studio`."""
    studio = studio or Studio(
        manager=manager, runs_dir=runs_dir, configs_dir=configs_dir, default_preset=default_preset
    )
    timer_s = timer_s or float(os.environ.get("GRPO_APP_TIMER_S", "1.5"))
    with gr.Blocks(title=TITLE, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"# {TITLE}\n{INTRO}", elem_id="app-title")
        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Train", id="train", elem_id="tab-train"):
                train = create_train_tab(studio, timer_s)
            with gr.Tab("Compare", id="compare", elem_id="tab-compare") as compare_tab:
                compare = create_compare_tab(studio)
            with gr.Tab("Try", id="try", elem_id="tab-try") as try_tab:
                tryit = create_try_tab(studio)
            with gr.Tab("Runs", id="runs", elem_id="tab-runs") as runs_tab:
                runs = create_runs_tab(studio)
            with gr.Tab("System", id="system", elem_id="tab-system") as system_tab:
                system = create_system_tab(studio)
        train.attach_load(demo)
        for tab, part in ((compare_tab, compare), (try_tab, tryit), (runs_tab, runs), (system_tab, system)):
            kw = dict(api_visibility="undocumented", show_progress="hidden", concurrency_limit=None)
            tab.select(part.refresh_fn, part.refresh_inputs, part.refresh_outputs, **kw)
            if part is not system:
                demo.load(part.refresh_fn, part.refresh_inputs, part.refresh_outputs, **kw)

        def release(request: gr.Request):
            if request is not None and request.session_hash:
                studio.evals.release(request.session_hash)

        demo.unload(release)
    serve_routes(demo, train.live.routes())  # the live view's plain routes (ui/live.py), served by launch
    demo.studio = studio  # the shared state, for main() and tests
    demo.pacer = train.pacer  # the poll pacing (ui/pacing.py), for tests
    demo.live = train.live  # the live view's answers (ui/live.py), for tests
    return demo


# ------------------------------------------------------------------------------------------------
# Serving
# ------------------------------------------------------------------------------------------------
def server_address() -> tuple[str, int]:
    """(host, port): localhost, or 0.0.0.0 on a Hugging Face Space; GRADIO_SERVER_NAME/PORT win."""
    host = os.environ.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if os.environ.get("SPACE_ID") else "127.0.0.1")
    try:
        port = int(os.environ.get("GRADIO_SERVER_PORT") or 7860)
    except ValueError:
        port = 7860
    return host, port


def auth_from_env() -> tuple[str, str] | None:
    user, password = os.environ.get("GRPO_APP_USERNAME", ""), os.environ.get("GRPO_APP_PASSWORD", "")
    if user and password:
        return (user, password)
    if user or password:
        log.warning("GRPO_APP_USERNAME and GRPO_APP_PASSWORD must both be set to require a login; serving without one.")
    return None


def launch_kwargs(limits: Limits | None = None) -> dict:
    limits = limits or Limits()
    host, port = server_address()
    return {
        "server_name": host,
        "server_port": port,
        "auth": auth_from_env(),
        "auth_message": "CPU GRPO Studio: log in with the user name and password you were given.",
        "max_file_size": f"{limits.max_upload_mb}mb",
        "allowed_paths": [],
        "show_error": False,  # messages are written for people; tracebacks stay in the server log
        "ssr_mode": False,
        "mcp_server": False,
        "footer_links": ["api"],
        "css": CSS,
        "theme": gr.themes.Default(text_size="lg"),
    }


def keep_connections_alive(demo: gr.Blocks, seconds: float | None = None) -> None:
    """Let an idle connection live longer than the longest poll period. Uvicorn closes a connection idle
    for 5 s; pages that poll less often (many pages: every 10-30 s, ui/pacing.py) then send each poll on a
    connection the server may be closing at that moment, and a client that does not retry gets an error
    (bench/watchers.py saw 2-10 in ~3,000 polls at 100 pages). Gradio does not expose the setting; its
    server reads its config for each new connection, so this acts on every connection after launch."""
    if seconds is None:  # twice the longest poll period, and some
        seconds = 2 * getattr(getattr(demo, "pacer", None), "max_s", max_period_from_env()) + 15
    config = getattr(getattr(demo, "server", None), "config", None)
    if config is not None and hasattr(config, "timeout_keep_alive"):
        config.timeout_keep_alive = max(config.timeout_keep_alive, int(seconds))


QUEUE_IDLE_POLL_S = 0.02  # how often Gradio's queue looks for a new event while it has none (Gradio: 0.001)
QUEUE_PROGRESS_POLL_S = 0.1  # ... and for progress to send while no event runs (Gradio: 0.01)


def calm_queue(demo: gr.Blocks) -> bool:
    """Make Gradio's queue poll less often while it is empty. Gradio 6 looks for a new event every 1 ms and for
    progress every 10 ms (50 and 100 ms on Windows): ~1,100 wake-ups a second of the server's event loop with no
    page open and no event queued. The app with no run and no page used 0.036-0.043 cores of a slow 2-core host,
    0.014-0.016 with this (docs/performance.md), each wake-up taking a core from the training
    beside it for a moment (the training's two threads wait for each other, so a moment taken from one stalls
    both). Polling every 20 ms / 100 ms makes a queued event (Start, Compare, Try, the What-if box) start at most
    20 ms later; the Train tab's live view does not go through the queue (ui/live.py). Gradio has no setting for
    it: this sets the queue's attributes, when they exist, after `demo.queue()`; returns whether it did."""
    queue = getattr(demo, "_queue", None)
    if queue is None or not hasattr(queue, "sleep_when_free"):
        return False
    queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_IDLE_POLL_S)
    if hasattr(queue, "progress_update_sleep_when_free"):
        queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, QUEUE_PROGRESS_POLL_S)
    return True


def queue_kwargs() -> dict:
    return {
        "max_size": env_int("GRPO_APP_QUEUE_SIZE", 200, 1),
        "default_concurrency_limit": env_int("GRPO_APP_CONCURRENCY", 4, 1),
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_libraries()
    # The training runs in a child process, so pages being answered do not slow it (manager.py);
    # GRPO_APP_TRAIN_PROCESS=0 trains in a thread of the server instead.
    demo = build_app(manager=RunManager(process=os.environ.get("GRPO_APP_TRAIN_PROCESS", "1") != "0"))
    studio: Studio = demo.studio
    stop_asked = threading.Event()
    first_signal: list[float] = []

    def on_signal(signum, frame):
        # A second Ctrl-C (not the echo of the first: `timeout` and process-group signals arrive twice)
        # exits at once; SIGTERM never does, a supervisor will follow it with SIGKILL if it must.
        now = time.monotonic()
        if first_signal and signum == signal.SIGINT and now - first_signal[0] > 2.0:
            print("\nSecond Ctrl-C: exiting now (the last saved checkpoint remains).", file=sys.stderr, flush=True)
            os._exit(130)
        if not first_signal:
            first_signal.append(now)
        stop_asked.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    kwargs = launch_kwargs(studio.limits)
    demo.queue(**queue_kwargs())
    calm_queue(demo)
    try:
        demo.launch(prevent_thread_lock=True, **kwargs)
    except OSError as e:  # e.g. the port is taken: say so without a traceback
        print(f"CPU GRPO Studio could not start: {e}", file=sys.stderr, flush=True)
        studio.shutdown(timeout=1)
        sys.exit(1)
    keep_connections_alive(demo)
    host, port = kwargs["server_name"], kwargs["server_port"]
    print(f"CPU GRPO Studio is serving on http://{host}:{port} (Ctrl-C stops it).", flush=True)
    try:
        while not stop_asked.wait(0.5):
            pass
    finally:
        if studio.manager.active:
            print(
                "Stopping the training run (within the step in progress; its last complete step is kept) — Ctrl-C again to quit now…",
                flush=True,
            )
        try:
            timeout = float(os.environ.get("GRPO_APP_STOP_TIMEOUT", "900"))
        except ValueError:
            timeout = 900.0
        outcome = studio.shutdown(timeout=timeout)
        print(f"Shutting down: {outcome}.", flush=True)
        demo.close()


if __name__ == "__main__":  # pragma: no cover
    main()
