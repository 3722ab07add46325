"""Files handed to a browser: a run's trained model as a zip or as an export (GGUF file, safetensors zip), a
comparison as CSV (no Gradio import).

They are written to a private folder in the system temp directory (the web server may serve files
from there, nothing else is exposed) and deleted after `max_age_s`.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

from grpo_app.core.run_folder import RunDir

MAX_AGE_S = 3600.0


def export_dir() -> Path:
    d = Path(tempfile.gettempdir()) / "grpo_app_exports"
    d.mkdir(parents=True, exist_ok=True)
    return d


def clean_exports(max_age_s: float = MAX_AGE_S) -> int:
    n, now = 0, time.time()
    for p in export_dir().glob("*"):
        try:
            if p.is_dir():
                for f in p.glob("*"):
                    if now - f.stat().st_mtime > max_age_s:
                        f.unlink()
                        n += 1
                if not any(p.iterdir()):
                    p.rmdir()
            elif now - p.stat().st_mtime > max_age_s:
                p.unlink()
                n += 1
        except OSError:
            pass
    return n


def _fresh_folder() -> Path:
    clean_exports()
    d = export_dir() / uuid.uuid4().hex[:12]
    d.mkdir()
    return d


def zip_trained_model(run: RunDir) -> Path:
    """`<run_id>-model.zip` holding run/final (from_pretrained-loadable). Stored, not deflated:
    safetensors barely compress and zipping 500 MB should not take minutes."""
    final = run.final_dir
    if not run.has_final_model():
        raise FileNotFoundError(f"run '{run.id}' has no trained model yet (it finishes with one).")
    out = _fresh_folder() / f"{run.id}-model.zip"
    tmp = out.with_suffix(".part")
    real_final = final.resolve()
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for f in sorted(final.rglob("*")):
            # only the run's own files: a symlink (to a file elsewhere on the server) is left out
            if f.is_file() and not f.is_symlink() and real_final in f.resolve().parents:
                zf.write(f, arcname=f"{run.id}/{f.relative_to(final)}")
        if run.config_path.is_file() and not run.config_path.is_symlink():
            zf.write(run.config_path, arcname=f"{run.id}/training_config.yaml")
    os.replace(tmp, out)
    return out


def write_text_export(name: str, text: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[-100:].lstrip(".-") or "export.txt"
    out = _fresh_folder() / safe
    out.write_text(text, encoding="utf-8")
    return out


def model_download(run: RunDir, fmt: str, quant: str):
    """(file for a browser, ExportResult): the run's model exported by `model_export.export_run` into
    <run>/export/<fmt>-<quant> (kept there, e.g. for a Hub push), handed over as the .gguf file itself or,
    for safetensors, the export folder (model, tokenizer, model card) as a zip."""
    from grpo_app.export.model_files import export_run

    res = export_run(run, fmt, quant)
    folder = _fresh_folder()
    if res.fmt == "gguf":
        out = folder / res.path.name
        try:
            os.link(res.path, out)  # same file system: no copy of hundreds of MB
        except OSError:
            import shutil

            shutil.copyfile(res.path, out)
        return out, res
    out = folder / f"{run.id}-{res.fmt}-{res.quant}.zip"
    tmp = out.with_suffix(".part")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for f in sorted(res.folder.iterdir()):
            if f.is_file():
                zf.write(f, arcname=f"{run.id}/{f.name}")
    os.replace(tmp, out)
    return out, res
