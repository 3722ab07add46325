import subprocess
import sys

import pytest

from .conftest import ROOT


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "grpo_app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


def test_validate_reports_each_bad_field_and_exits_2():
    r = cli("validate", "--config", "quick", "--set", "grpo.num_generations=1", "--set", "grpo.learning_rate=0")
    assert r.returncode == 2
    assert "grpo.num_generations" in r.stderr and "grpo.learning_rate" in r.stderr
    assert "Traceback" not in r.stderr
    ok = cli("validate", "--config", "classroom")
    assert ok.returncode == 0 and "OK: preset 'classroom'" in ok.stdout


def test_explain_lists_settings_rewards_presets():
    assert "grpo.num_generations" in cli("explain").stdout
    assert "correctness" in cli("explain", "rewards").stdout
    assert "classroom" in cli("explain", "presets").stdout


def test_train_bad_preset_is_a_clear_error():
    r = cli("train", "--config", "clasroom")
    assert r.returncode == 2 and "did you mean 'classroom'" in r.stderr.lower()


def test_cli_train_eval_and_runs_on_tiny_model(tmp_path):
    import os

    env = dict(os.environ, GRPO_APP_RUNS_DIR=str(tmp_path))
    r = cli("train", "--config", "tests/configs/tiny.yaml", "--set", "stages[1].steps=1", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "stage 1 's1'" in r.stdout and "completed" in r.stdout
    run_id = next(p.name for p in tmp_path.iterdir() if p.is_dir())
    e = cli("eval", "--model", run_id, "--n", "4", "--max-new-tokens", "8", env=env)
    assert e.returncode == 0, e.stderr[-2000:]
    assert "accuracy" in e.stdout and "95% Wilson interval" in e.stdout
    ls = cli("runs", env=env)
    assert run_id in ls.stdout and "completed" in ls.stdout
    # held-out problems like the run's first stage, checked against its training pools and saved in the run
    c = cli("compare", "--run", run_id, "--stage", "1", "--n", "4", "--max-new-tokens", "8", env=env)
    assert c.returncode == 0, c.stderr[-2000:]
    assert "held-out problems like stage 1 (s1)" in c.stdout and f"vs run {run_id}" in c.stdout
    assert "checked: 0 of these 4 problems were trained on (against the problems its steps trained on and its stage pools)" in c.stdout
    assert str(tmp_path) not in c.stdout  # run ids, not server folders
    saved = list((tmp_path / run_id / "eval").glob("stage1-s1-n4-seed0.*"))
    assert sorted(p.suffix for p in saved) == [".csv", ".json"]
    for bad, text in ((("--stage", "1", "--trained", "x"), "--stage needs --run"), (("--run", run_id, "--stage", "9"), "stages 0..")):
        b = cli("compare", *bad, "--n", "2", env=env)
        assert b.returncode == 2 and text in b.stderr and "Traceback" not in b.stderr, b.stderr


def test_commands_that_do_not_train_ignore_a_launcher_world_size(tmp_path):
    import os

    env = dict(os.environ, WORLD_SIZE="2", RANK="0", GRPO_APP_RUNS_DIR=str(tmp_path))
    ok = cli("validate", "--config", "quick", env=env)  # (training in two processes: tests/test_distributed.py)
    assert ok.returncode == 0
    bad = cli("train", "--config", "tests/configs/tiny.yaml", "-s", "grpo.num_generations=1", env=env)
    assert bad.returncode == 2 and "grpo.num_generations" in bad.stderr and "Traceback" not in bad.stderr
    assert not any(tmp_path.iterdir())  # a bad config fails before any process group or run folder


# ---- Bad input is one clear line and exit code 2 (run in-process) ----------------------------------------------
def _one_line_error(capsys, argv) -> str:
    from grpo_app.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and len(err) < 400, err
    return err


@pytest.mark.parametrize(
    "make, argv, words",
    [
        (lambda d: (d / "c.yaml").write_bytes(b"\xff\xfe\x00"), ["validate", "--config", "{d}/c.yaml"], "not UTF-8"),
        (lambda d: (d / "c.yaml").mkdir(), ["validate", "--config", "{d}/c.yaml"], "is a folder"),
        (lambda d: (d / "c.yaml").write_text("a: &x 1\nb: *x\n"), ["train", "--config", "{d}/c.yaml"], "aliases"),
        (None, ["validate", "--set", "grpo.learning_rate=[1"], "not valid YAML"),  # not YAML
        (None, ["validate", "--set", "model.name=!!python/object/apply:os.system [ls]"], "tag"),  # a tag
        (None, ["train", "--set", "model.name.x=1"], "'model.name' is a value"),  # a path through a scalar
        (None, ["validate", "--set", "grpo.num_generations=" + "9" * 5000], "cannot be read"),
        (lambda d: (d / "runs").write_text("x"), ["runs", "--runs-dir", "{d}/runs"], "is a file"),
        (lambda d: (d / "runs").write_text("x"), ["resume", "r1", "--runs-dir", "{d}/runs"], "is a file"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, capsys, make, argv, words):
    if make is not None:
        make(tmp_path)
    err = _one_line_error(capsys, [a.replace("{d}", str(tmp_path)) for a in argv])
    assert words in err


def test_train_into_a_runs_folder_that_is_a_file(tmp_path, capsys):
    (tmp_path / "runs").write_text("x")
    err = _one_line_error(capsys, ["train", "--config", "tests/configs/tiny.yaml", "--set", f"run.output_dir={tmp_path}/runs"])
    assert "Cannot start" in err and "is a file" in err


def test_train_while_another_process_trains_in_the_same_runs_folder(tmp_path, capsys, monkeypatch):
    from grpo_app.runs.manager import _TrainLock

    monkeypatch.setenv("GRPO_APP_RUNS_DIR", str(tmp_path))
    held = _TrainLock(tmp_path / ".train.lock")  # what the app's manager holds while it trains
    assert held.acquire()
    try:
        err = _one_line_error(capsys, ["train", "--config", "tests/configs/tiny.yaml"])
    finally:
        held.release()
    assert "in progress in another process" in err
