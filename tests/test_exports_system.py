"""Downloads (model zip, CSV) in a private temp folder, and the System panel's facts."""

import os
import tempfile
import time
import zipfile

import pytest
import torch

from grpo_app.core import system
from grpo_app.core.config import load_config
from grpo_app.core.run_folder import RunDir
from grpo_app.export import downloads as exports
from grpo_app.ui import render


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_zip_trained_model_holds_the_final_folder_and_config(tmp_path, private_tmp):
    run = RunDir.create(tmp_path / "runs", load_config("tests/configs/tiny.yaml"))
    with pytest.raises(FileNotFoundError, match="no trained model"):
        exports.zip_trained_model(run)
    run.final_dir.mkdir()
    (run.final_dir / "config.json").write_text("{}")
    (run.final_dir / "model.safetensors").write_bytes(b"\0" * 1000)
    path = exports.zip_trained_model(run)
    assert path.parent.parent == private_tmp / "grpo_app_exports" and path.name == f"{run.id}-model.zip"
    names = set(zipfile.ZipFile(path).namelist())
    assert names == {f"{run.id}/config.json", f"{run.id}/model.safetensors", f"{run.id}/training_config.yaml"}


def test_text_export_sanitises_the_name_and_old_files_are_cleaned(private_tmp):
    p = exports.write_text_export("../../etc/passwd compare.csv", "a,b\n")
    assert p.read_text() == "a,b\n" and p.parent.parent == private_tmp / "grpo_app_exports"
    assert "/" not in p.name and not p.name.startswith(".")
    old = time.time() - 2 * exports.MAX_AGE_S
    os.utime(p, (old, old))
    assert exports.clean_exports() == 1 and not p.exists() and not p.parent.exists()


def test_safetensors_params_reads_shapes_without_loading(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, str(tmp_path / "model.safetensors"))
    params, size = system.safetensors_params(tmp_path)
    assert params == 17 and size == (tmp_path / "model.safetensors").stat().st_size
    assert system.safetensors_params(tmp_path / "nothing") is None


def test_system_info_has_what_the_panel_shows():
    info = system.system_info()
    assert info["cpu"]["logical_cores"] >= 1 and info["cpu"]["torch_threads"] >= 1
    # the level torch's kernels dispatch to on this CPU, as torch names it (x86: AVX2 or AVX512 here)
    assert info["cpu"]["kernels"] == str(torch.backends.cpu.get_cpu_capability())
    assert f"torch kernels: {info['cpu']['kernels']}" in render.system_md(info)
    assert 0 < info["memory"]["available_mb"] <= info["memory"]["total_mb"]
    assert info["versions"]["torch"] != "not installed" and "gradio" in info["versions"]
    assert "name" in info["embedded_model"]
