"""Run folders from outside the app's control: symlinked run ids are never served, damaged runs never break a view."""

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from grpo_app.core.config import load_config
from grpo_app.core.run_folder import RunDir, list_runs, resolve_run
from grpo_app.runs.manager import RunManager

from .conftest import checkpoint_files


def _fake_model(folder, text="{}"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(text)
    (folder / "model.safetensors").write_bytes(b"weights")


@pytest.fixture
def runs_and_links(tmp_path):
    """runs/ with one real run ('real', with a trained model), and two symlinked run folders: 'outside' points at a
    run-shaped folder outside runs/, 'alias' at the real run."""
    root = tmp_path / "runs"
    real = RunDir.create(root, load_config("quick"))
    _fake_model(real.final_dir)
    elsewhere = tmp_path / "private" / "someone-elses-run"
    elsewhere.mkdir(parents=True)
    (elsewhere / "config.yaml").write_text((real.path / "config.yaml").read_text())
    _fake_model(elsewhere / "final", '{"secret": true}')
    (root / "outside").symlink_to(elsewhere, target_is_directory=True)
    (root / "alias").symlink_to(real.path, target_is_directory=True)
    return root, real, elsewhere


# ---- Run ids are resolved in one place (runs.resolve_run) -----------------------------------------------------
def test_symlinked_run_folders_are_not_runs(runs_and_links):
    root, real, elsewhere = runs_and_links
    assert [r.id for r in list_runs(root)] == [real.id]  # the symlinked ones are left out of every list
    assert resolve_run(root, real.id).path == real.path
    manager = RunManager(root)
    for rid in ("outside", "alias"):
        with pytest.raises(ValueError, match="no run"):
            resolve_run(root, rid)
        with pytest.raises(ValueError, match="no run"):
            manager.get(rid)
        with pytest.raises(ValueError, match="no run"):
            manager.resume(rid)
        with pytest.raises(ValueError, match="no run"):
            manager.delete(rid)
    assert (elsewhere / "final" / "config.json").is_file() and real.path.is_dir()  # nothing was deleted
    for bad in ("../runs", "a/b", "", None, 5, "x" * 200):
        with pytest.raises(ValueError):
            resolve_run(root, bad)


def test_a_symlinked_run_is_not_a_model_name(runs_and_links):
    from grpo_app.ui.forms import check_model_name

    root, real, elsewhere = runs_and_links
    roots = [root.resolve()]
    assert check_model_name(real.id, roots, root) == (str(real.final_dir), None)
    name, problem = check_model_name("outside", roots, root)
    assert name is None and problem
    name, problem = check_model_name(str(root / "outside"), roots, root)  # as a folder path: it resolves outside
    assert name is None and "outside the model folders" in problem


def test_a_real_run_whose_final_links_elsewhere_has_no_model(runs_and_links, tmp_path):
    from grpo_app.export.downloads import zip_trained_model
    from grpo_app.ui.forms import check_model_name

    root, real, elsewhere = runs_and_links
    other = RunDir.create(root, load_config("quick", ["run.name=other"]))
    other.final_dir.symlink_to(elsewhere / "final", target_is_directory=True)
    assert not other.has_final_model()
    name, problem = check_model_name(other.id, [root.resolve()], root)
    assert name is None and "no trained model" in problem
    name, problem = check_model_name(str(other.path), [root.resolve()], root)
    assert name is None and "outside" in problem
    with pytest.raises(FileNotFoundError):
        zip_trained_model(other)


def test_the_zip_holds_only_the_runs_own_files(runs_and_links, tmp_path):
    from grpo_app.export.downloads import zip_trained_model

    root, real, elsewhere = runs_and_links
    secret = tmp_path / "private" / "secret.txt"
    secret.write_text("server secret")
    (real.final_dir / "notes.txt").symlink_to(secret)
    names = zipfile.ZipFile(zip_trained_model(real)).namelist()
    assert f"{real.id}/config.json" in names and f"{real.id}/model.safetensors" in names
    assert not any("notes" in n for n in names)


def test_cli_run_ids_follow_the_same_rule(runs_and_links, monkeypatch):
    from grpo_app.cli import _resolve_model_arg

    root, real, elsewhere = runs_and_links
    monkeypatch.setenv("GRPO_APP_RUNS_DIR", str(root))
    assert _resolve_model_arg(real.id) == str(real.final_dir)
    assert _resolve_model_arg("outside") == "outside"  # not a run: passed on (and refused as a model name)
    assert _resolve_model_arg("embedded") == "embedded"


def test_pages_refuse_symlinked_runs(runs_and_links, monkeypatch):
    from grpo_app.ui.forms import FormError
    from grpo_app.ui.studio import Studio

    root, real, elsewhere = runs_and_links
    studio = Studio(manager=RunManager(root), configs_dir="tests/configs/app")
    try:
        assert studio.runs.run_ids() == [real.id] and studio.runs.run_ids(with_model=True) == [real.id]
        for call in (lambda: studio.runs.get_run("outside"), lambda: studio.run_with_model("outside")):
            with pytest.raises(FormError, match="no run"):
                call()
        res = studio.train.resume("outside")
        assert not res.ok and "no run" in res.message
        res = studio.runs.delete_run("outside", "outside")
        assert not res.ok and (elsewhere / "config.yaml").is_file()
    finally:
        studio.shutdown(timeout=5)


# ---- A damaged run never breaks a view --------------------------------------------------------------------------
DAMAGE = [
    # (file, content, status shown, reason shown)
    ("status.json", b"[1, 2]", "damaged", "status.json is not a JSON object"),  # valid JSON, not an object
    ("status.json", b'\xff\xfe{"status": "completed"}', "damaged", "status.json is not a JSON object"),  # not UTF-8
    ("status.json", b'{"status": 5, "started": "x", "stage": "q"}', "damaged", "of the wrong type"),  # wrong types
    ("config.yaml", b"\xff\xfe\x00", "damaged", "config.yaml: config.yaml: is not UTF-8"),  # not UTF-8
    ("config.yaml", b"- 1\n- 2\n", "damaged", "config.yaml: config: the file must contain a mapping"),  # a list
    ("config.yaml", b"model: {name: 5}\nfoo: 1\n", "damaged", "unknown section"),  # not a valid config
    ("config.yaml", b"a: &x 1\nb: *x\n", "damaged", "aliases"),  # refused YAML
    ("metrics.jsonl", b'[1]\n5\n"x"\n{"step": 1, "reward": 0.5}\n', "interrupted", "3 damaged lines"),  # not objects
    ("metrics.jsonl", b'{"step": 1, "reward": 0.5}\n\xff\xfe\n', "interrupted", "1 damaged lines"),  # not UTF-8
    ("metrics.jsonl", b'{"step": "x", "reward": "r", "rewards": 5}\n', "interrupted", "1 damaged lines"),  # types
    ("metrics.jsonl", b'{"step": 1, "reward": Infinity, "loss": 1e400}\n', "interrupted", "1 damaged lines"),
    ("events.jsonl", b'{"event": 5}\n{"event": "stage_start", "stage": "a"}\n[3]\n', "interrupted", None),
    ("events.jsonl", b"[" * 100_000 + b"\n", "interrupted", None),  # nested past Python's recursion limit
    ("status.json", b"[" * 100_000, "damaged", "status.json is not a JSON object"),
    ("eval/gsm8k-n2-seed0.json", b'{"base": {"summary": {"n": 2, "accuracy": "x", "ci": [0, 1]}}, "trained": '
     b'{"summary": {"n": 2, "accuracy": 0.5, "ci": [0, 1]}}, "paired": {"p_value": "y"}}', "interrupted", None),
    ("memory.jsonl", b'{"time": "x", "rss_mb": "y"}\n\xff\n', "interrupted", None),
    ("latest_step.json", b"[1]", "interrupted", None),  # the step view's record, not an object
    ("latest_step.json", b'{"groups": 5, "step": "x"}', "interrupted", None),
    ("latest_step.json", b'{"groups": [{"completions": ["a", "b"], "rewards": {"r": [1]}, "totals": [1, 2]}]}',
     "interrupted", None),  # a reward list shorter than the completions
]


@pytest.mark.parametrize("name, content, status, reason", DAMAGE)
def test_a_damaged_run_is_listed_and_every_view_works(tmp_path, capsys, name, content, status, reason):
    from grpo_app.cli import main
    from grpo_app.runs import monitor
    from grpo_app.ui import render
    from grpo_app.ui.studio import Studio

    root = tmp_path / "runs"
    good = RunDir.create(root, load_config("quick", ["run.name=good"]))
    bad = RunDir.create(root, load_config("quick", ["run.name=zz-bad"]))  # the newest: the Train tab follows it
    (bad.path / name).parent.mkdir(exist_ok=True)
    (bad.path / name).write_bytes(content)

    summary = bad.summary()
    assert summary["status"] == status
    if reason:
        assert reason in summary["error"] and reason in summary["damage"]
    assert good.summary()["status"] == "interrupted" and good.summary()["damage"] is None

    studio = Studio(manager=RunManager(root), configs_dir="tests/configs/app")
    try:
        # the Train tab's tick
        view = studio.view()
        assert view["run_id"] == bad.id and view["state"] == status
        render.status_html(monitor.progress(view))
        studio.train.chart_json(view)
        step = view.get("latest_step")
        render.step_html(step, 0), render.group_choices(step), render.events_md(view["events"])
        studio.train.status()
        # the Runs tab: the list and the opened run
        rows = render.run_rows(studio.runs.run_summaries())
        assert [r[1] for r in rows] == [status, "interrupted"]
        opened = studio.runs.run_view(studio.runs.get_run(bad.id))
        studio.train.chart_json(opened)
        details = render.run_details_md(studio.runs.get_run(bad.id).summary(), opened["events"])
        assert (reason or "") in details
        assert render.eval_rows(studio.runs.run_evals(studio.runs.get_run(bad.id))) == []
        monitor.resumable(bad), monitor.resume_target(studio.manager)
    finally:
        studio.shutdown(timeout=5)
    # the CLI lists it with the reason
    assert main(["runs", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert bad.id in out and good.id in out and (reason or "") in out


def test_a_damaged_run_cannot_be_resumed_but_can_be_deleted(tmp_path):
    root = tmp_path / "runs"
    bad = RunDir.create(root, load_config("quick"))
    bad.config_path.write_bytes(b"\xff")
    manager = RunManager(root)
    with pytest.raises(ValueError, match="is damaged .*config.yaml"):
        manager.resume(bad.id)
    manager.delete(bad.id)
    assert not bad.path.exists()


# ---- Resume passes over a checkpoint that would not load --------------------------------------------------------
def _checkpoint(run: RunDir, stage: int, step: int):
    d = checkpoint_files(run.checkpoints_dir / f"stage-{stage}" / f"checkpoint-{step}")
    (d / "engine_state.json").write_text(json.dumps({"stage_index": stage, "stage_step": step, "global_step": step}))
    (d / "COMPLETE").write_text("x")
    return d


def _truncate(path, keep: int = 100):
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda d: _truncate(d / "model.safetensors"), "model.safetensors is truncated"),  # a cut copy
        (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 8), "model.safetensors is truncated"),
        (lambda d: (d / "model.safetensors").unlink(), "no model weights"),  # a missing file
        (lambda d: _truncate(d / "optimizer.pt"), "optimizer.pt is truncated"),
        (lambda d: (d / "trainer_state.json").write_text("[]"), "trainer_state.json"),
        (lambda d: (d / "engine_state.json").write_text('{"stage_index": "x"}'), None),  # not a checkpoint at all
    ],
)
def test_the_newest_checkpoint_that_loads_is_chosen(tmp_path, damage, why):
    run = RunDir.create(tmp_path, load_config("quick"))
    _checkpoint(run, 0, 2)
    newest = _checkpoint(run, 0, 4)
    assert run.latest_checkpoint()["stage_step"] == 4
    damage(newest)
    assert run.latest_checkpoint()["stage_step"] == 2
    skipped = run.damaged_checkpoints()
    if why:
        assert [n for n, _ in skipped] == ["checkpoint-4"] and why in skipped[0][1]
    else:
        assert skipped == []
    run.prune_checkpoints(1)  # the damaged one never counts as the one kept
    assert run.latest_checkpoint()["stage_step"] == 2


def test_resume_passes_over_a_truncated_checkpoint_and_completes(tmp_path):
    """A real tiny run: its newest checkpoint is cut short (a full disk, a copy that stopped); Resume continues
    from the one before, says so, and the run completes with every step once."""
    root = tmp_path / "runs"
    over = [f"run.output_dir={root}", "stages[0].steps=1", "stages[1].steps=2", "run.keep_checkpoints=5", "run.eval_n=0"]
    manager = RunManager(root)
    run = manager.start(load_config("tests/configs/tiny.yaml", over))
    assert manager.wait(600) and run.read_status()["status"] == "completed"
    newest = run.latest_checkpoint()
    assert (newest["stage_index"], newest["stage_step"]) == (1, 2)
    _truncate(Path(newest["path"]) / "model.safetensors", 4096)
    run.write_status(status="stopped")  # as if it had been stopped before its last step was final
    shutil.rmtree(run.final_dir)

    manager.resume(run.id)
    assert manager.wait(600) and run.read_status()["status"] == "completed", run.read_status()
    resumed = [e for e in run.events() if e["event"] == "resumed"][-1]
    assert resumed["checkpoint"] == "checkpoint-1" and resumed["step"] == 2
    assert "checkpoint-2: model.safetensors is truncated" in resumed["skipped"][0]
    assert [m["step"] for m in run.metrics()] == [1, 2, 3] and run.has_final_model()
