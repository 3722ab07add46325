"""A real page in headless Chromium polls at the period the server sets (ui/pacing.py): with a budget of
0.25 polls a second for all pages, one open page is told to poll every 4 s instead of the timer's 1 s,
and its browser does. The app runs in this process so the test can count the polls the server answered
(the page's timer requests do not all show up as Playwright page requests)."""

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
    # the timer's own 1 s would give ~16 polls; the server's 4 s period gives 4 (one more or less at the edges)
    assert 3 <= polls <= 6, (polls, seconds)
    assert demo.pacer.pages == 1
