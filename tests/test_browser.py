"""The real app in headless Chromium, as a student uses it: Start training, watch the charts and the
inside of a GRPO step fill, reload mid-run and see the charts continue, Stop; Compare with a small N;
Try; Runs; System. Screenshots of each tab go to GRPO_APP_SCREENSHOT_DIR (default: a temp folder;
`bench/screenshots.py` makes the README ones with the real model).

Skipped when Chromium or Playwright is missing, unless GRPO_APP_REQUIRE_BROWSER=1 (then it fails).
"""

import os
from pathlib import Path

import pytest

from tests.app_server import AppServer, stages, start_args, status, wait_for, wait_idle

pytestmark = pytest.mark.browser
CHROMIUM = os.environ.get("GRPO_APP_CHROMIUM", "/usr/bin/chromium")
TIMEOUT_MS = 180_000


def _unavailable(reason: str):
    if os.environ.get("GRPO_APP_REQUIRE_BROWSER") == "1":
        pytest.fail(f"browser tests required but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed")
    if not Path(CHROMIUM).exists():
        _unavailable(f"no Chromium at {CHROMIUM}")
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        except Exception as e:  # noqa: BLE001
            _unavailable(f"Chromium does not start: {e}")
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = AppServer(tmp_path_factory.mktemp("browser-app")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = Path(os.environ.get("GRPO_APP_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def page(browser, server):
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(server.url)
    pg.wait_for_selector("#start-btn")
    yield pg
    pg.close()


def chart_points(page, elem_id: str) -> int:
    return page.evaluate(
        """(id) => { const el = document.querySelector(`#${id} .js-plotly-plot`);
                     return el && el.data && el.data.length ? (el.data[0].x || []).filter(v => v !== null).length : 0; }""",
        elem_id,
    )


def test_train_watch_reload_stop(page, server, shots):
    client = server.client()
    wait_idle(client)
    page.click("#start-btn")
    page.wait_for_selector("#train-message >> text=Started run")
    wait_for(lambda: chart_points(page, "chart-reward") >= 2, 300, what="reward points on the chart")
    for chart in ("chart-loss", "chart-length", "chart-throughput", "chart-memory"):
        wait_for(lambda c=chart: chart_points(page, c) >= 1, 120, what=f"points on {chart}")
    rows = page.locator("#grpo-step table.gs-table tbody tr")
    wait_for(lambda: rows.count() >= 5, 120, what="the GRPO step table")  # G = 4 completions + the group line
    assert "Advantage" in page.inner_text("#grpo-step") and "Gold answer" in page.inner_text("#grpo-step")
    assert "running" in page.inner_text("#status")
    page.screenshot(path=str(shots / "screenshot_train.png"), full_page=True)

    before = chart_points(page, "chart-reward")
    page.reload()  # a reload reattaches to the running job with its whole history ...
    page.wait_for_selector("#start-btn")
    wait_for(lambda: chart_points(page, "chart-reward") >= before, 120, what="the history after a reload")
    wait_for(
        lambda: chart_points(page, "chart-reward") > before, 300, what="new steps after the reload"
    )  # ... and continues

    page.click("#stop-btn")
    page.wait_for_selector("#train-message >> text=Stopping")
    wait_for(lambda: "stopped" in page.inner_text("#status"), 300, what="the status to say stopped")
    assert status(client)["state"] == "stopped"


def test_compare_and_try(page, server, shots):
    client = server.client()
    wait_idle(client)
    msg = client.predict(
        *start_args(
            preset="tiny-short",
            completion_length=16,
            stages=stages(["s1", "arithmetic", 1, 1, 2], ["s2", "arithmetic", 2, 2, 2]),
        ),
        api_name="/start",
    )[0]
    run_id = msg.split("**")[1]
    wait_for(lambda: status(client)["state"] == "completed", 300, what="the short run to complete")

    page.get_by_role("tab", name="Compare").click()
    wait_for(lambda: run_id in page.input_value("#compare-run input"), 60, what="the run in the Compare tab")
    page.fill("#compare-n input", "4")
    page.fill("#compare-tokens input", "32")
    page.press("#compare-tokens input", "Tab")
    page.click("#compare-btn")
    page.wait_for_selector("#compare-summary .card-big >> nth=1")
    cards = page.locator("#compare-summary .card-big").all_inner_texts()
    assert len(cards) == 2 and all(c.endswith("%") for c in cards)
    assert "McNemar" in page.inner_text("#compare-summary")
    wait_for(lambda: chart_points(page, "compare-chart") >= 1, 60, what="the difficulty chart")
    page.screenshot(path=str(shots / "screenshot_compare.png"), full_page=True)

    page.get_by_role("tab", name="Try").click()
    wait_for(lambda: run_id in page.input_value("#try-run input"), 60, what="the run in the Try tab")
    page.fill("#try-question textarea", "What is 12 + 30?")
    page.fill("#try-gold input", "42")
    page.click("#try-btn")
    page.wait_for_selector("#try-answer-trained .answer-pred")
    page.wait_for_selector("#try-answer-base .answer-pred")
    assert "Extracted answer" in page.inner_text("#try-answer-base")
    page.screenshot(path=str(shots / "screenshot_try.png"), full_page=True)


def test_stage_task_matrix_beside_a_run_without_ewc(page, server, shots):
    """Issue 42: two short runs, with and without EWC; the Compare tab draws both runs' stage x task matrices
    side by side, with intervals on hover and the transfer sentences under them."""
    client = server.client()
    ids = {}
    for ewc in (False, True):  # the EWC run last: the newest run, the one the Compare tab opens on
        wait_idle(client)
        msg = client.predict(
            *start_args(preset="tiny-short", completion_length=16, ewc=ewc, run_name=f"matrix-{'ewc' if ewc else 'plain'}",
                        stages=stages(["s1", "arithmetic", 1, 1, 2], ["s2", "arithmetic", 2, 2, 2])),
            api_name="/start",
        )[0]
        ids[ewc] = msg.split("**")[1]
        wait_for(lambda i=ids[ewc]: (s := status(client))["run_id"] == i and s["state"] == "completed", 300,
                 what="a short run to complete")
    page.reload()
    page.wait_for_selector("#start-btn")
    page.get_by_role("tab", name="Compare").click()
    # the page load's run list has landed (it opens the newest run); a later one keeps what the user picks
    wait_for(lambda: page.input_value("#compare-run input") == ids[True], 60, what="the Compare tab's run list")
    page.fill("#matrix-other input", ids[False])
    page.press("#matrix-other input", "Enter")
    page.fill("#matrix-n input", "4")
    page.press("#matrix-n input", "Tab")
    page.click("#matrix-btn")
    page.wait_for_selector("#matrix-note >> text=Backward transfer")
    traces = page.evaluate(
        """() => { const el = document.querySelector('#matrix-plot .js-plotly-plot');
                   return el && el.data ? el.data.map(t => [t.type, t.y.length, t.x.length, t.customdata[1][0]]) : []; }"""
    )
    assert [t[:3] for t in traces] == [["heatmap", 3, 2], ["heatmap", 3, 2]], traces  # base + 2 stages x 2 tasks
    assert all("% [" in t[3] and "vs the row above" in t[3] for t in traces)  # interval and paired change on hover
    note = page.inner_text("#matrix-note")
    assert f"{ids[True]} (EWC λ" in note and f"{ids[False]} (no EWC)" in note and "plasticity" in note
    assert note.count("what a model that always wrote it would score") == 2  # each task's floor (2 tasks)
    page.screenshot(path=str(shots / "screenshot_matrix.png"), full_page=True)


def test_runs_and_system(page, server, shots):
    import psutil

    page.get_by_role("tab", name="Runs").click()
    wait_for(lambda: "completed" in page.inner_text("#runs-table"), 60, what="the run list")
    table = page.inner_text("#runs-table")
    on_disk = [p.name for p in server.runs_dir.iterdir() if (p / "config.yaml").is_file()]
    assert on_disk and all(run_id in table for run_id in on_disk)  # every run of the folder is listed
    assert str(server.runs_dir) not in table  # ids, never server folders
    page.screenshot(path=str(shots / "screenshot_runs.png"), full_page=True)
    page.get_by_role("tab", name="System").click()
    page.wait_for_selector("#system-info >> text=Cores")
    info = page.inner_text("#system-info")
    assert f"{psutil.cpu_count(logical=False)} physical" in info  # this machine's cores
    page.screenshot(path=str(shots / "screenshot_system.png"), full_page=True)
