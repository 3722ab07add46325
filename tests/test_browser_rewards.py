"""Rewards of your own and the loss options in headless Chromium (issue 44, items 2 and 3), on the real app with
a tiny random model: a preset with a declarative reward fills the Train tab's "Rewards of your own" table; the
loss type and advantage scaling are picked from the page; Start trains on them; the run's config holds them,
"Inside a GRPO step" shows the reward's column, and What if? shows the advantages under every scaling with the
run's marked. Screenshots: screenshot_rewards_tiny.png, screenshot_scalings_tiny.png."""

import pytest
import yaml

from tests.app_server import AppServer, status, wait_for
from tests.test_browser import TIMEOUT_MS, browser, shots  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser

PRESET = """\
preset: tiny-rewards
description: Tests only - a tiny random model with a reward of your own.
model: {name: tiny-random}
stages:
  - {name: s1, source: arithmetic, min_difficulty: 1, max_difficulty: 1, steps: 2, num_problems: 4}
rewards:
  weights: {correctness: 1.0, has_number: 0.5, short: 1.0}
  custom:
    - {name: short, rule: length, min_tokens: 1, max_tokens: 12}
grpo: {num_generations: 4, prompts_per_step: 2, max_completion_length: 24, learning_rate: 0.001, temperature: 1.0}
ewc: {enabled: false}
run: {save_every: 1, keep_checkpoints: 2}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("rewards-app")
    configs = work / "configs"
    configs.mkdir()
    (configs / "tiny-rewards.yaml").write_text(PRESET)
    s = AppServer(work, {"GRPO_APP_CONFIGS_DIR": str(configs), "GRPO_APP_DEFAULT_PRESET": "tiny-rewards"}).start()
    yield s
    s.stop()


def pick(page, elem_id: str, option: str) -> None:
    page.click(f"#{elem_id} input")
    page.get_by_role("option", name=option, exact=True).click()


def test_a_reward_of_your_own_and_dr_grpo_scaling_from_the_page(browser, server, shots):  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(server.url)
    page.wait_for_selector("#start-btn")
    page.click("#custom-rewards-box button.label-wrap")
    wait_for(lambda: "short" in page.inner_text("#custom-rewards") and "length" in page.inner_text("#custom-rewards"),
             60, what="the preset's reward in the table")
    assert "1-12" in page.inner_text("#custom-rewards")
    page.locator("#custom-rewards-box").screenshot(path=str(shots / "screenshot_rewards_tiny.png"))
    pick(page, "loss-type", "dr_grpo")
    pick(page, "scale-rewards", "none")
    page.click("#start-btn")
    page.wait_for_selector("#train-message >> text=Started run")
    client = server.client()
    wait_for(lambda: status(client)["state"] in ("completed", "failed", "stopped"), 600, what="the run's end")
    st = status(client)
    assert st["state"] == "completed", server.log_tail()
    cfg = yaml.safe_load((server.runs_dir / st["run_id"] / "config.yaml").read_text())
    assert cfg["grpo"]["loss_type"] == "dr_grpo" and cfg["grpo"]["scale_rewards"] == "none"
    assert cfg["rewards"]["custom"] == [{"name": "short", "rule": "length", "min_tokens": 1.0, "max_tokens": 12.0}]
    # the step view and What if? show the reward of your own; What if? gives all three scalings, the run's marked
    wait_for(lambda: page.locator("#what-if .wi-scalings tr").count() == 4, 120, what="the scalings table")
    assert "short" in page.inner_text("#what-if .wi-table thead")
    rows = page.locator("#what-if .wi-scalings tbody tr").all_inner_texts()
    assert [r.split(":")[0] for r in rows] == ["group", "batch", "none"]
    assert "(this run)" in rows[2] and "(this run)" not in rows[0]
    page.locator("#what-if-box").screenshot(path=str(shots / "screenshot_scalings_tiny.png"))
    page.close()
