"""README screenshots of every tab, taken from the real app training the real embedded model.

    python bench/screenshots.py [--out assets] [--steps 3] [--n 20]

Starts `python app.py` on a free port (runs in a temporary folder, offline), trains the `quick`
preset (its two short stages) with SmolLM2-135M, and photographs in headless
Chromium: Train while it runs, Compare (base vs trained on --n GSM8K test problems), Try, Runs and
System. Every number on the pictures comes from that run; nothing is staged. Takes 10-30 minutes
on 2 CPU cores.

    python bench/screenshots.py --matrix RUN_ID OTHER_RUN_ID [--n 100] [--out assets]

instead photographs the Compare tab's stage x task matrix of two finished runs of the app's runs folder
(e.g. the same preset with and without EWC), on --n held-out problems per task: a matrix saved in the runs'
eval/ folders for that N (by the CLI or bench/learning.py --matrix) shows at once, else the page computes it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("GRPO_APP_CHROMIUM", "/usr/bin/chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout: float, what: str, every: float = 2.0):
    t = time.time()
    while time.time() - t < timeout:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


def open_app(p, url: str, timeout_ms: int):
    """A headless Chromium page on the app, once its Train tab has drawn."""
    browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
    page = browser.new_page(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
    page.set_default_timeout(timeout_ms)
    page.goto(url)
    page.wait_for_selector("#start-btn")
    return browser, page


def matrix_shot(url: str, out: Path, ids: list[str], n: int) -> int:
    """The Compare tab's stage x task matrix of two runs, beside each other (assets/screenshot_matrix.png)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, url, 3_600_000)
        page.get_by_role("tab", name="Compare").click()
        page.fill("#compare-run input", ids[0])
        page.press("#compare-run input", "Enter")
        page.fill("#matrix-other input", ids[1])
        page.press("#matrix-other input", "Enter")
        page.fill("#matrix-n input", str(n))
        page.press("#matrix-n input", "Tab")
        page.click("#matrix-btn")
        page.wait_for_selector("#matrix-note >> text=Backward transfer")
        time.sleep(2)
        top, bottom = page.evaluate(  # page coordinates of the matrix section: from its button to its note
            """() => { const y = id => document.querySelector(id).getBoundingClientRect();
                       return [y('#matrix-btn').top + window.scrollY, y('#matrix-note').bottom + window.scrollY]; }"""
        )
        page.screenshot(path=str(out / "screenshot_matrix.png"), full_page=True,
                        clip={"x": 0, "y": max(0, top - 140), "width": 1440, "height": bottom - top + 180})
        browser.close()
    print(f"matrix screenshot: {out / 'screenshot_matrix.png'}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "assets"))
    ap.add_argument("--steps", type=int, default=0, help="steps per stage (0 = the preset's own)")
    ap.add_argument("--n", type=int, default=20, help="GSM8K test problems for Compare (with --matrix: per task)")
    ap.add_argument("--matrix", nargs=2, metavar=("RUN_ID", "OTHER_RUN_ID"),
                    help="photograph the stage x task matrix of these two runs (in GRPO_APP_RUNS_DIR or models/runs)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    sys.path.insert(0, str(ROOT))
    from gradio_client import Client
    from playwright.sync_api import sync_playwright

    from grpo_app.core.models import cache_root, embedded_model_dir

    embedded_model_dir()
    work = Path(tempfile.mkdtemp(prefix="grpo-shots-"))
    port = free_port()
    env = dict(os.environ)
    env.update(
        GRADIO_SERVER_PORT=str(port),
        GRADIO_SERVER_NAME="127.0.0.1",
        GRPO_APP_RUNS_DIR=env.get("GRPO_APP_RUNS_DIR", str(ROOT / "models" / "runs")) if args.matrix else str(work / "runs"),
        GRPO_APP_MODELS_DIR=str(work / "models"),
        GRPO_APP_CACHE_DIR=str(cache_root()),
        GRPO_APP_DEFAULT_PRESET="quick",
        HF_HUB_OFFLINE=env.get("HF_HUB_OFFLINE", "1"),
        PYTHONUNBUFFERED="1",
    )
    log = open(work / "app.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def up():
            try:
                with urllib.request.urlopen(url + "/config", timeout=5):
                    return True
            except OSError:
                return proc.poll() is not None and sys.exit(f"the app exited; see {work / 'app.log'}")

        wait_for(up, 300, "the app")
        if args.matrix:
            return matrix_shot(url, out, args.matrix, args.n)
        client = Client(url, verbose=False)
        values = client.predict("quick", api_name="/preset")
        table = values[3]
        for row in table["data"]:
            row[4] = args.steps or row[4]
        start = [
            "quick",
            values[1],
            values[2],
            None,
            table,
            values[4],
            values[5],
            values[6],
            values[7],
            values[8],
            values[9],
            values[10],
            values[11],
            "readme",
            values[12],
            values[13],
            values[14],
        ]
        msg = client.predict(*start, api_name="/start")[0]
        print(msg, flush=True)
        run_id = msg.split("**")[1]

        with sync_playwright() as p:
            browser, page = open_app(p, url, 600_000)
            total = sum(int(row[4]) for row in table["data"])
            wait_for(
                lambda: client.predict(api_name="/status")["step"] >= total - 2,
                3600,
                "training steps",
                every=5,
            )
            time.sleep(3)
            page.screenshot(path=str(out / "screenshot_train.png"), full_page=True)
            print("train screenshot", flush=True)
            wait_for(
                lambda: client.predict(api_name="/status")["state"] == "completed", 3600, "the run to finish", every=5
            )

            page.get_by_role("tab", name="Compare").click()
            wait_for(lambda: run_id in page.input_value("#compare-run input"), 60, "the run in Compare", every=0.5)
            page.fill("#compare-n input", str(args.n))
            page.press("#compare-n input", "Tab")
            page.click("#compare-btn")
            page.wait_for_selector("#compare-summary .card-big >> nth=1", timeout=3_600_000)
            time.sleep(2)
            page.screenshot(path=str(out / "screenshot_compare.png"), full_page=True)
            print("compare screenshot", flush=True)

            page.get_by_role("tab", name="Try").click()
            wait_for(lambda: run_id in page.input_value("#try-run input"), 60, "the run in Try", every=0.5)
            page.fill(
                "#try-question textarea",
                "A baker made 24 rolls in the morning and 18 in the afternoon. "
                "She sold 30 of them. How many rolls are left?",
            )
            page.fill("#try-gold input", "12")
            page.click("#try-btn")
            page.wait_for_selector("#try-answer-trained .answer-pred", timeout=600_000)
            page.wait_for_selector("#try-answer-base .answer-pred", timeout=600_000)
            page.screenshot(path=str(out / "screenshot_try.png"), full_page=True)
            print("try screenshot", flush=True)

            page.get_by_role("tab", name="Runs").click()
            wait_for(lambda: "completed" in page.inner_text("#runs-table"), 60, "the run list", every=0.5)
            client_open = page.locator("#runs-pick input")
            client_open.fill(run_id)
            client_open.press("Enter")
            page.click("#runs-open")
            page.wait_for_selector("#run-details >> text=completed")
            time.sleep(2)
            page.screenshot(path=str(out / "screenshot_runs.png"), full_page=True)
            print("runs screenshot", flush=True)

            page.get_by_role("tab", name="System").click()
            page.wait_for_selector("#system-info >> text=Cores")
            page.screenshot(path=str(out / "screenshot_system.png"), full_page=True)
            print("system screenshot", flush=True)
            browser.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(600)
            except subprocess.TimeoutExpired:
                proc.kill()
        print(f"app log and run folder: {work}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
