"""Crash-safe files: the one atomic write, the JSON / JSONL readers, and publishing a folder whole.

Every writer in the project goes through here:
- `atomic_write_text` / `atomic_write_json`: temp file in the same folder, fsync, `os.replace`; a reader
  never sees half a file.
- `append_jsonl` / `read_jsonl`: one flushed line per record; a torn last line (a crash mid-write) and any
  line that is not a JSON object are skipped, and the next append starts on a new line after a torn one.
- `read_json`: a missing, unreadable or undecodable file gives `default` instead of an exception.
- `publish_dir`: a folder is built under a temporary name and renamed into place, so a crash never leaves
  a half-written folder under the final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w"):
    """Open a temporary file beside `path` for writing; on a clean exit it is fsynced and renamed onto
    `path`, on an error it is removed. `mode` is "w" (text, UTF-8) or "wb"."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, default=_json_default))


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def append_jsonl(path: Path, obj: dict) -> None:
    """Append one JSON line (NaN/inf become null), flushed and fsynced so a crash loses at most it."""
    line = (json.dumps(clean_json(obj), default=_json_default) + "\n").encode("utf-8")
    with open(path, "ab+") as fh:
        if fh.seek(0, os.SEEK_END) > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":  # a torn last line (crash mid-write): start a new line, never join it
                line = b"\n" + line
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def clean_json(obj):
    """`obj` with NaN and infinities replaced by None (JSON has neither)."""
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_json(v) for v in obj]
    return obj


def read_jsonl(path: Path, skipped: list[int] | None = None) -> list[dict]:
    """Every complete line that holds a JSON object; a torn last line (crash mid-write), a line that is not
    an object and bytes that are not UTF-8 are skipped, so a damaged file never breaks a reader. The numbers
    of skipped complete lines (damage, not a torn end) are appended to `skipped` when it is given."""
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for i, raw in enumerate(fh, 1):
                line = raw.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except (ValueError, RecursionError):
                    rec = None
                if isinstance(rec, dict):
                    out.append(rec)
                elif skipped is not None and raw.endswith("\n"):
                    skipped.append(i)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        pass
    return out


def read_json(path: Path, default=None):
    """The file's JSON value, or `default` if it is missing, unreadable, not UTF-8 or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        return default


def read_json_object(path: Path) -> dict | None:
    """Like `read_json`, but only a JSON object counts: anything else is None."""
    value = read_json(path)
    return value if isinstance(value, dict) else None


def safetensors_header(path: Path) -> dict | None:
    """The JSON header of a .safetensors file, or None when the file is not whole: unreadable, a header that
    is not a JSON object, or shorter than the tensors its header lists (a truncated copy or a crash)."""
    try:
        size = Path(path).stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return None
            n = int.from_bytes(head, "little")
            if n <= 0 or n > min(size - 8, 100 * 2**20):
                return None
            header = json.loads(fh.read(n))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    end = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        offsets = meta.get("data_offsets") if isinstance(meta, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return None
        end = max(end, offsets[1])
    return header if size >= 8 + n + end else None


def publish_dir(folder: Path, target: Path) -> Path:
    """Rename a fully written `folder` onto `target`, replacing an older `target`."""
    target = Path(target)
    if target.exists():
        shutil.rmtree(target)
    os.replace(folder, target)
    return target


@contextlib.contextmanager
def staged_dir(target: Path):
    """Yield a fresh temporary folder beside `target`; on a clean exit it is published as `target`
    (`publish_dir`), on an error it is removed and `target` is left as it was."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, target)


# ------------------------------------------------------------------------------------------------
# Texts a page may read: no absolute server path
# ------------------------------------------------------------------------------------------------
# An absolute POSIX path: a '/' not preceded by a word character, '.', ':' or another '/' (so "3/4", "a/b",
# "http://host/x" and "./rel" stay as they are), then at least one "name/" and a last name.
_ABS_PATH = re.compile(r"(?<![\w.:/~])/(?:[\w.@+\-~]+/)+([\w.@+\-~]*)")


def hide_server_paths(text: str) -> str:
    """`text` with every absolute path cut to its last name ('/srv/app/models/x/final' -> '…/final').

    For a message born elsewhere (an exception's text, a library's error) on its way to a page or a shared
    log, where the server's folders are nobody's business (issue 45). Messages the project writes itself name
    things as a user knows them ('the local GSM8K folder', 'models/', a run id) and pass through unchanged."""
    if not text or "/" not in text:
        return text
    return _ABS_PATH.sub(lambda m: "…/" + m.group(1) if m.group(1) else "…/", text)
