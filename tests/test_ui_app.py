"""The app's assembly and launch settings, in-process (no server): endpoints, env settings, notes."""

import pytest

from grpo_app.ui import app as ui_app
from grpo_app.ui.compare_tab import result_note


def test_address_defaults_to_localhost_and_0000_on_a_space(monkeypatch):
    for var in ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT", "SPACE_ID"):
        monkeypatch.delenv(var, raising=False)
    assert ui_app.server_address() == ("127.0.0.1", 7860)
    monkeypatch.setenv("SPACE_ID", "someone/grpo-studio")
    assert ui_app.server_address() == ("0.0.0.0", 7860)
    monkeypatch.setenv("GRADIO_SERVER_NAME", "10.0.0.5")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "8080")
    assert ui_app.server_address() == ("10.0.0.5", 8080)


def test_login_needs_both_variables(monkeypatch):
    monkeypatch.delenv("GRPO_APP_USERNAME", raising=False)
    monkeypatch.delenv("GRPO_APP_PASSWORD", raising=False)
    assert ui_app.auth_from_env() is None
    monkeypatch.setenv("GRPO_APP_USERNAME", "teacher")
    assert ui_app.auth_from_env() is None  # half a login is no login (and a warning in the log)
    monkeypatch.setenv("GRPO_APP_PASSWORD", "s3cret")
    assert ui_app.auth_from_env() == ("teacher", "s3cret")


def test_launch_settings(monkeypatch):
    monkeypatch.setenv("GRPO_APP_MAX_UPLOAD_MB", "3")
    kw = ui_app.launch_kwargs()
    assert kw["max_file_size"] == "3mb" and kw["allowed_paths"] == [] and kw["show_error"] is False
    q = ui_app.queue_kwargs()
    assert q["max_size"] >= 50 and 1 <= q["default_concurrency_limit"] <= 16


def test_build_app_names_every_action(tmp_path):
    demo = ui_app.build_app(runs_dir=tmp_path / "runs", configs_dir="tests/configs/app", default_preset="tiny-app")
    names = {fn.api_name for fn in demo.fns.values() if fn.api_name}
    assert {
        "start",
        "stop",
        "resume",
        "status",
        "compare",
        "try",
        "runs",
        "delete",
        "open_run",
        "download",
        "upload",
        "preset",
        "system",
        "resume_run",
    } <= names
    ids = {b.elem_id for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    assert {
        "start-btn",
        "stop-btn",
        "resume-btn",
        "status",
        "chart-reward",
        "chart-loss",
        "chart-length",
        "chart-memory",
        "chart-throughput",
        "grpo-step",
        "compare-btn",
        "try-btn",
        "runs-table",
        "system-info",
    } <= ids
    assert demo.studio.default_preset == "tiny-app"


@pytest.mark.parametrize(
    "result,text",
    [
        ({"what": "GSM8K test, difficulty 0–10", "origin": "GSM8K test (local folder x)"}, "Problem set: GSM8K test"),
        (
            {"what": "GSM8K test, difficulty 0–10", "origin": "held-out reasoning-gym gsm_symbolic"},
            "GSM8K is not available on this server, so the problems are held-out reasoning-gym gsm_symbolic instead.",
        ),
        (
            {
                "what": "held-out problems like stage 1 (add)",
                "origin": "x",
                "overlap_with_training": {"n": 5, "in_training": 0},
            },
            "Checked: none of these 5 problems occurs in the run's training pools, not even with its terms in another order.",
        ),
        (
            {
                "what": "held-out problems like stage 1 (add)",
                "origin": "x",
                "overlap_with_training": {"n": 5, "in_training": 2, "commuted": 1,
                                          "checked_against": "the problems its steps trained on and its stage pools"},
            },
            "2 of these 5 problems were also trained on (1 with their terms in another order): checked against the "
            "problems its steps trained on and its stage pools.",
        ),
    ],
)
def test_compare_note_says_what_was_scored(result, text):
    assert text in result_note(result)
