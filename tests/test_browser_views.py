"""The three classroom views in headless Chromium, on the real app with a tiny random model: "What if?"
under Inside a GRPO step, Answers across training on the Runs tab, and pass@k on the Compare tab.

The server gets its own preset (tests write it): one stage of two problems, so each problem is sampled at
every step, and a `brevity` reward over 192-token completions, so a random model's groups get different totals
and non-zero advantages on any CPU: its completions are 110-140 words, inside the stretch where brevity falls from
1 at 60 words to 0 at 200, so a group ties only if all its completions have the same number of words. (At 128 tokens
they were 55-90 words, and a group all under 60 words would tie at 1, leaving a weight nothing to move.)
Screenshots go to GRPO_APP_SCREENSHOT_DIR (default: a temp folder).
"""

import re

import pytest

from tests.app_server import AppServer, status, wait_for
from tests.test_browser import TIMEOUT_MS, browser, shots  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser

PRESET = """\
preset: tiny-views
description: Tests only - a tiny random model; two problems per stage, brevity makes groups differ.
model: {name: tiny-random}
stages:
  - {name: s1, source: arithmetic, min_difficulty: 1, max_difficulty: 1, steps: 3, num_problems: 2}
rewards:
  weights: {correctness: 1.0, brevity: 1.0}
grpo: {num_generations: 4, prompts_per_step: 2, max_completion_length: 192, learning_rate: 0.001, temperature: 1.0}
ewc: {fisher_samples: 4, lam: 1000}
run: {save_every: 1, keep_checkpoints: 2}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("views-app")
    configs = work / "configs"
    configs.mkdir()
    (configs / "tiny-views.yaml").write_text(PRESET)
    s = AppServer(work, {"GRPO_APP_CONFIGS_DIR": str(configs), "GRPO_APP_DEFAULT_PRESET": "tiny-views"}).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def page(browser, server):
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(server.url)
    pg.wait_for_selector("#start-btn")
    yield pg
    pg.close()


@pytest.fixture(scope="module")
def run_id(page, server):
    """One completed run of the tiny-views preset, started from the page."""
    client = server.client()
    page.click("#start-btn")
    page.wait_for_selector("#train-message >> text=Started run")
    state = wait_for(
        lambda: (st := status(client)["state"]) in ("completed", "failed", "stopped") and st, 900, what="the run's end"
    )
    assert state == "completed", server.log_tail()
    return status(client)["run_id"]


def advantages(page, selector: str) -> list[str]:
    return page.locator(selector).all_inner_texts()


def set_slider(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def test_what_if_recomputes_the_advantages_when_a_weight_moves(page, run_id, shots, server):
    # the box shows the run's last step: a slider move recomputes the latest step, so reading `before` from a step
    # the page drew earlier (its last draw can trail the run's end by a poll) compared two different groups
    last = status(server.client())["step"]
    wait_for(lambda: f"of step {last}:" in page.inner_text("#what-if .wi-head"), 120, what="the last step's box")
    wait_for(lambda: page.locator("#what-if .wi-adv").count() == 4, 120, what="the what-if table")
    wait_for(lambda: page.input_value("#wi-brevity input[type=number]") == "1", 60, what="the run's weights")
    before = advantages(page, "#what-if .wi-adv")
    recorded = advantages(page, "#what-if .wi-table td.adv:not(.wi-adv)")
    assert before == recorded  # with the run's own weights the what-if gives the recorded advantages
    assert set(before) != {"+0.00"}, f"the group's totals tie, so no weight can move its advantages: {before}"
    page.locator("#what-if-box").screenshot(path=str(shots / "screenshot_what_if.png"))
    # brevity off: correctness alone is left (a random model is never right), so every total and advantage is 0
    set_slider(page, "wi-brevity", 0)
    wait_for(lambda: advantages(page, "#what-if .wi-adv") != before, 60, what="recomputed advantages")
    assert advantages(page, "#what-if .wi-adv") == ["+0.00"] * 4
    assert "brevity" not in page.inner_text("#what-if .wi-head")  # a zero weight drops the reward from the total
    # half the group: two rows
    set_slider(page, "wi-brevity", 1)
    set_slider(page, "wi-size", 2)
    wait_for(lambda: page.locator("#what-if .wi-adv").count() == 2, 60, what="a group of two")
    assert "first 2 of 4" in page.inner_text("#what-if")
    page.click("#wi-reset")
    wait_for(lambda: page.locator("#what-if .wi-adv").count() == 4, 60, what="the run's weights back")
    assert advantages(page, "#what-if .wi-adv") == before


def test_a_draw_answered_after_a_slider_keeps_the_newer_box(browser, run_id, server):  # noqa: F811 - fixture
    """The race of ui/choices.py, made certain: a new page's first draw is computed by the server, then held (a
    routed request) while the user moves a slider and that answer lands; the draw lands last. The page keeps the
    box it chose (brevity off: every advantage 0), not the draw's older one (the run's weights)."""
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.set_default_timeout(TIMEOUT_MS)
    held = []
    pg.route("**/grpo_app/draw?*", lambda route: held.append((route, route.fetch())))  # answered by the server now
    try:
        pg.goto(server.url)
        # (the sync API runs the route's handler only while the test talks to the browser)
        wait_for(lambda: pg.evaluate("1") and held, 120, what="the page's first draw")
        assert "Step <b>" not in pg.inner_html("#grpo-step")  # nothing drawn yet
        set_slider(pg, "wi-correctness", 1)  # brevity stays at the page's 0
        wait_for(lambda: advantages(pg, "#what-if .wi-adv") == ["+0.00"] * 4, 60, what="the slider's answer")
        route, answer = held.pop()
        route.fulfill(response=answer)  # the draw lands last, with the run's weights computed before the move
        wait_for(lambda: "Step <b>" in pg.inner_html("#grpo-step"), 60, what="the draw's step view")
        assert advantages(pg, "#what-if .wi-adv") == ["+0.00"] * 4
        assert pg.input_value("#wi-brevity input[type=number]") == "0"
        assert pg.input_value("#wi-correctness input[type=number]") == "1"
        pg.unroute("**/grpo_app/draw?*")
        pg.click("#wi-reset")  # the run's weights come back when asked for
        wait_for(lambda: pg.input_value("#wi-brevity input[type=number]") == "1", 60, what="the run's weights")
        assert set(advantages(pg, "#what-if .wi-adv")) != {"+0.00"}
    finally:
        pg.close()


def test_answers_across_training_move_along_the_steps(page, run_id, shots):
    page.get_by_role("tab", name="Runs").click()
    wait_for(lambda: run_id in page.input_value("#runs-pick input"), 60, what="the run opened on the Runs tab")
    page.wait_for_selector("#answers-view .ans-trend")
    text = page.inner_text("#answers-view")
    assert "was sampled 3 times" in text and "Showing time 1 (step 1)" in text
    first = page.inner_text("#answers-view .gs-table:not(.ans-trend)")
    set_slider(page, "answers-pos", 3)
    wait_for(lambda: "Showing time 3 (step 3)" in page.inner_text("#answers-view"), 60, what="time 3")
    assert page.inner_text("#answers-view .gs-table:not(.ans-trend)") != first  # other sampled answers
    page.locator("#answers-box").screenshot(path=str(shots / "screenshot_answers_across_steps.png"))
    # one step, every problem
    page.click("#answers-problem input")
    page.get_by_role("option", name=re.compile("Every problem of one step")).click()
    wait_for(lambda: "Recorded step 1 of 3" in page.inner_text("#answers-view"), 60, what="the step view")
    assert page.locator("#answers-view .gs").count() == 2  # two prompts per step
    set_slider(page, "answers-pos", 2)
    wait_for(lambda: "training step <b>2</b>" in page.inner_html("#answers-view"), 60, what="step 2")


def test_compare_with_pass_k_draws_both_curves(page, run_id, shots):
    page.get_by_role("tab", name="Compare").click()
    wait_for(lambda: run_id in page.input_value("#compare-run input"), 60, what="the run in the Compare tab")
    page.fill("#compare-n input", "3")
    page.fill("#compare-tokens input", "16")
    page.fill("#compare-passk-n input", "4")
    page.fill("#compare-passk-t input", "0.8")
    page.press("#compare-passk-t input", "Tab")
    page.click("#compare-btn")
    page.wait_for_selector("#compare-summary .card-big >> nth=1")
    page.wait_for_selector("#compare-passk .js-plotly-plot")
    traces = page.evaluate(
        """() => { const el = document.querySelector('#compare-passk .js-plotly-plot');
                   return el.data.map(t => [t.name, t.x.length]); }"""
    )
    assert [t[1] for t in traces] == [4, 4] and [t[0].split(":")[0] for t in traces] == ["base", "trained"]
    assert "temperature 0.8" in page.inner_text("#compare-passk")
    page.locator("#compare-passk").screenshot(path=str(shots / "screenshot_passk.png"))
    # a bad temperature is refused with a message, nothing starts
    page.fill("#compare-passk-t input", "0")
    page.press("#compare-passk-t input", "Tab")
    page.click("#compare-btn")
    wait_for(lambda: "temperature" in page.inner_text("#compare-progress"), 60, what="the temperature message")
