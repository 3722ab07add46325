"""The new views in headless Chromium: the Train tab's preview (config.yaml and the command), and in the
Runs tab a run's config.yaml, the Export action (a GGUF comes back as a file) and the Hub push on an
offline server. The run is a tiny random model written into the app's runs folder by the test.

Screenshots go to GRPO_APP_SCREENSHOT_DIR (assets/screenshot_*_tiny.png were taken this way: tiny run)."""

import shlex
import urllib.request

import pytest

from grpo_app.cli import build_parser
from grpo_app.core.config import load_config
from tests.app_server import wait_for
from tests.test_browser import TIMEOUT_MS, browser, server, shots  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser


@pytest.fixture
def page(browser, server):  # noqa: F811
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(server.url)
    pg.wait_for_selector("#start-btn")
    yield pg
    pg.close()


def code_text(page, elem_id: str) -> str:
    """The text of a gr.Code as the page renders it (CodeMirror draws the lines in view: the first ones)."""
    return page.evaluate(
        """(id) => Array.from(document.querySelectorAll(`#${id} .cm-line`)).map(l => l.textContent).join('\\n')""",
        elem_id,
    )


def test_train_tab_previews_the_config_and_the_command(page, shots):  # noqa: F811
    page.fill("#seed input", "7")
    page.press("#seed input", "Tab")
    page.click("#preview-box button.label-wrap")
    page.click("#preview-btn")
    wait_for(lambda: "python -m grpo_app train" in code_text(page, "preview-command"), 60, what="the command")
    command = code_text(page, "preview-command")
    assert "--config tests/configs/app/tiny-app.yaml" in command and "--set run.seed=7" in command
    text = code_text(page, "preview-yaml")
    # the command on the page builds the config on the page (whose first lines are in view)
    argv = shlex.split(command.replace("\\\n", " "))
    args = build_parser().parse_args(argv[3:])
    cfg = load_config(args.config, args.set)
    assert cfg.run.seed == 7 and text.startswith("preset: tiny-app") and len(text.splitlines()) >= 15
    assert cfg.to_yaml().startswith(text)
    assert "Start would run exactly this" in page.inner_text("#preview-message")
    page.locator("#preview-box").screenshot(path=str(shots / "screenshot_config_preview_tiny.png"))


def test_runs_tab_shows_config_exports_gguf_and_push_says_offline(page, server, shots, tokenizer):  # noqa: F811
    from tests.test_model_export import finished_run

    run = finished_run(server.runs_dir, tokenizer)
    page.get_by_role("tab", name="Runs").click()
    page.click("#runs-refresh")
    wait_for(lambda: run.id in page.inner_text("#runs-table"), 60, what="the run in the list")
    wait_for(lambda: run.id in page.input_value("#runs-pick input"), 60, what="the run picked")
    page.click("#run-config-box button.label-wrap")
    wait_for(lambda: "preset: tiny-test" in code_text(page, "run-config"), 60, what="config.yaml")
    shown = code_text(page, "run-config")
    assert run.config_path.read_text().startswith(shown) and len(shown.splitlines()) >= 15

    page.click("#runs-export-box button.label-wrap")
    page.click("#runs-export-format input")
    page.get_by_role("option", name="GGUF q8_0 — about half the size of f16").click()
    page.click("#runs-export")
    link = page.locator("#runs-export-file a").first
    link.wait_for()
    assert f"{run.id}-q8_0.gguf" in page.inner_text("#runs-export-file").replace("\n", "")
    href = link.get_attribute("href")
    with urllib.request.urlopen(href if href.startswith("http") else server.url + href, timeout=60) as r:
        assert r.read(4) == b"GGUF"
    msg = page.inner_text("#runs-message")
    assert f"Exported {run.id} as GGUF q8_0" in msg and f"export/gguf-q8_0/{run.id}-q8_0.gguf" in msg
    assert str(server.runs_dir) not in msg  # never a server path on the page
    assert (run.path / "export" / "gguf-q8_0" / "README.md").is_file()
    page.locator("#runs-export-box").screenshot(path=str(shots / "screenshot_export_tiny.png"))

    page.fill("#runs-hub-repo input", "someone/tiny-grpo")
    page.click("#runs-push")
    wait_for(lambda: "Not pushed" in page.inner_text("#runs-message"), 60, what="the push message")
    msg = page.inner_text("#runs-message")
    assert "offline" in msg and "Nothing was lost" in msg and str(server.runs_dir) not in msg
    assert (run.path / "export" / "gguf-q8_0" / f"{run.id}-q8_0.gguf").is_file()
