"""A real page in headless Chromium polls at the period the server sets (ui/pacing.py): with a budget of
0.25 requests a second for all pages, one open page is told to poll every 4 s or more (more while the
draws its polls lead to count too) instead of the timer's 1 s, and its browser does. And while a run trains, the page asks for a new step once: one draw request, not
one per part it shows. The app runs in this process so the test can count the requests the server
answered (the page's timer requests do not all show up as Playwright page requests)."""

import collections
import functools
import threading
import time

import pytest

from grpo_app.ui import app as ui_app
from tests.app_server import free_port
from tests.test_browser import TIMEOUT_MS, browser  # noqa: F401 - fixture

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def served(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("GRPO_APP_POLL_BUDGET", "0.25")
    demo = ui_app.build_app(
        runs_dir=tmp_path_factory.mktemp("pacing") / "runs", configs_dir="tests/configs/app",
        default_preset="tiny-app", timer_s=1.0,
    )
    port = free_port()
    demo.queue().launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    yield demo, f"http://127.0.0.1:{port}"
    demo.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_the_page_polls_at_the_period_the_server_sets(browser, served):  # noqa: F811
    demo, url = served
    pg = browser.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(url)
    pg.wait_for_selector("#start-btn")
    time.sleep(3)  # the first answers set the page's timer to the server's period
    n0, t0 = demo.pacer.polls, time.monotonic()
    time.sleep(16)
    polls, seconds = demo.pacer.polls - n0, time.monotonic() - t0
    pg.close()
    # the timer's own 1 s would give ~16 polls; the server's 4 s period gives 4 (one more or less at the edges),
    # fewer for a while after the page's first draws (the chart, the memory chart), which count against the budget
    assert 2 <= polls <= 6, (polls, seconds)
    assert demo.pacer.pages == 1


def count_calls(demo) -> collections.Counter:
    """Count every event function the server runs, by api name (or function name), from now on."""
    counts, lock = collections.Counter(), threading.Lock()
    for fid, bf in demo.fns.items():
        if bf.fn is None:
            continue
        name = bf.api_name or getattr(bf.fn, "__name__", str(fid))

        def counted(*a, _fn=bf.fn, _name=name, **k):
            with lock:
                counts[_name] += 1
            return _fn(*a, **k)

        bf.fn = functools.update_wrapper(counted, bf.fn)
    return counts


def test_a_new_step_costs_the_page_one_request(browser, served):  # noqa: F811
    """Every request costs the server CPU taken from the training (docs/performance.md): before 2026-11-24 a
    page asked three times for each new step (charts, step view, then the What-if box through the step view's
    change listener, queued), and until 2026-11-25 each request went through Gradio's pipeline."""
    demo, url = served
    counts = count_calls(demo)
    budget, demo.pacer.budget = demo.pacer.budget, 1.0  # 1 request/s: a poll every 2-4 s, each with its draw
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(url)
    pg.wait_for_selector("#start-btn")
    pg.click("#start-btn")
    try:
        deadline = time.monotonic() + 120
        while len(demo.studio.view()["metrics"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(4)  # the page has drawn the run once
        before, served0 = collections.Counter(counts), collections.Counter(demo.live.served)
        steps0, draws0 = len(demo.studio.view()["metrics"]), demo.pacer.draws
        time.sleep(20)
        calls, served = counts - before, demo.live.served - served0
        steps, draws = len(demo.studio.view()["metrics"]) - steps0, demo.pacer.draws - draws0
        # the run's steps are shorter than the page's period: every poll sees a new step
        assert steps >= 8 and 3 <= served["poll"] <= 12, (steps, served)
        # no Gradio event runs for a new step: the page fetches the live view's plain routes (ui/live.py; before
        # 2026-11-25 the poll and the draw were Gradio events, and before 2026-11-24 there were two more)
        assert calls == {}, calls
        # at most one draw per poll (one more when the window opened between a poll and the draw it caused)
        assert 1 <= served["draw"] <= served["poll"] + 1, served
        assert draws == served["draw"] + served["memory"]  # the pacer hears of every draw (its budget counts them)
        # and the one draw brought everything a step changes: charts, the step's table, the What-if box
        pg.wait_for_selector("#grpo-step .gs-table")
        pg.wait_for_selector("#what-if .wi-adv")
        assert pg.locator("#chart-reward .js-plotly-plot").count() == 1
    finally:
        demo.pacer.budget = budget
        demo.studio.train.stop()
        demo.studio.manager.wait(120)
        pg.close()
