"""Runs side by side in headless Chromium (issue 44): three tiny runs written into the app's runs folder, picked
on the Runs tab; one line per run on the shared charts, the settings in which they differ, the leaderboard of
two scored runs, then the missing third scored from the page. Screenshot: screenshot_side_by_side_tiny.png."""

import pytest

from tests.app_server import wait_for
from tests.test_browser import browser, server, shots  # noqa: F401 - fixtures
from tests.test_browser_export import page  # noqa: F401 - fixture
from tests.test_side_by_side import make_runs, save_result

pytestmark = pytest.mark.browser


def traces(page, elem_id: str) -> int:
    """Lines Plotly drew in a chart."""
    return page.locator(f"#{elem_id} .scatterlayer .trace").count()


def test_three_runs_side_by_side_with_a_leaderboard_and_the_missing_one_scored(page, server, shots, tokenizer):  # noqa: F811
    a, b, c = make_runs(server.runs_dir, tokenizer, name="browser")
    saved = "gsm8k-n20-seed0-d0-99"  # two results written by the test (on its own problems)
    save_result(a, saved, [1] * 9 + [0] * 11, [0] * 20)
    save_result(b, saved, [1] * 15 + [0] * 5, [0] * 20)
    page.get_by_role("tab", name="Runs").click()
    page.click("#runs-refresh")
    wait_for(lambda: c.id in page.inner_text("#runs-table"), 60, what="the runs in the list")
    page.click("#side-box button.label-wrap")
    for run in (a, b, c):
        page.click("#side-runs input")
        page.get_by_role("option", name=run.id).click()
    page.click("#side-btn")
    wait_for(lambda: traces(page, "side-chart-reward") == 3, 60, what="three lines on the reward chart")
    assert traces(page, "side-chart-length") == 3 and traces(page, "side-chart-memory") == 3
    diff = page.inner_text("#side-diff")
    assert "ewc.enabled" in diff and "grpo.num_generations" in diff and "run.name" not in diff
    board = page.inner_text("#side-board")
    assert board.index(b.id) < board.index(a.id) and c.id not in board
    assert "best" in board and c.id in page.inner_text("#side-board-note")  # missing, said so

    page.fill("#side-n input", "2")
    page.press("#side-n input", "Tab")
    page.click("#side-score")
    seen = []

    def ranked():
        seen[:] = [page.inner_text("#side-progress"), page.inner_text("#side-note")]
        return c.id in page.inner_text("#side-board")

    try:
        wait_for(ranked, 900, what="the third run scored and ranked")
    except AssertionError as e:
        raise AssertionError(f"{e}; the page showed {seen}") from None
    assert "finished" in page.inner_text("#side-progress")
    # scored for real on 2 problems: all three runs (none had a result on these), ranked together
    assert all((r.eval_dir / "gsm8k-n2-seed0-d0-99.json").is_file() for r in (a, b, c))
    assert all(r.id in page.inner_text("#side-board") for r in (a, b))
    assert str(server.runs_dir) not in page.inner_text("#side-box")  # never a server path on the page
    page.locator("#side-box").screenshot(path=str(shots / "screenshot_side_by_side_tiny.png"))
