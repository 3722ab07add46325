"""Run folders from outside the app's control: symlinked run ids are never served, damaged runs never break a view."""

import zipfile

import pytest

from grpo_app.config import load_config
from grpo_app.manager import RunManager
from grpo_app.runs import RunDir, list_runs, resolve_run


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
    from grpo_app.exports import zip_trained_model
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
    from grpo_app.exports import zip_trained_model

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
        assert studio.run_ids() == [real.id] and studio.run_ids(with_model=True) == [real.id]
        for call in (lambda: studio.get_run("outside"), lambda: studio.run_with_model("outside")):
            with pytest.raises(FormError, match="no run"):
                call()
        res = studio.resume("outside")
        assert not res.ok and "no run" in res.message
        res = studio.delete_run("outside", "outside")
        assert not res.ok and (elsewhere / "config.yaml").is_file()
    finally:
        studio.shutdown(timeout=5)
