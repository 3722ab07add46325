"""The run folder: its layout, its records, its checkpoints. No threads, no jobs (see manager.py).

A run folder `models/runs/<run_id>/` holds:
  config.yaml          the full config (written atomically)
  status.json          status, pid, stage/step, error (atomic: temp file + rename)
  metrics.jsonl        one line per logged step, appended and flushed
  events.jsonl         stage start/end, Fisher done, stop, resume, error
  memory.jsonl         RSS samples (every 0.5 s, also during generation)
  latest_step.json     the groups of the latest step: prompts, completions, rewards, advantages
  steps.jsonl          every step's groups (one line per step; completions cut to STEPS_MAX_CHARS characters).
                       Bounded: past STEPS_MAX_BYTES the file is rewritten (atomically) without every second
                       step of its older half (the first step and the newer half stay whole), so early training
                       becomes sparser but every step kept is complete; the latest step is always kept.
                       A re-done step (after a resume) replaces the earlier line of the same step when read.
  trained_problems.jsonl   the problems each step trained on (step, stage, [id, question] per prompt), one line
                       per step and process, never thinned: what held-out sets are checked against (issue 46)
  checkpoints/stage-K/checkpoint-N/   resumable (model, optimizer, RNG, engine_state.json, COMPLETE)
  ewc/stage-K/         Fisher + anchor after stage K
  stage_ends/stage-K.safetensors   (runs without EWC) the trainable weights as stage K ended; with EWC the
                       anchor in ewc/stage-K is the same thing, and final/ is the last stage's (stage matrix)
  final/               the trained model, loadable with from_pretrained
  eval/                evaluation results (JSON + CSV)

A crash at any moment leaves a readable run: JSONL readers skip a torn last line, and a run whose
status says "running" but whose process is gone is reported as "interrupted".

Run folders are also read as untrusted input. A run id from a page or the command line goes through
`resolve_run` (a symlinked folder, or one resolving outside the runs folder, is no run); records are checked
against the types readers rely on (`STATUS_FIELDS`, `METRIC_FIELDS`, ...); a run whose config.yaml or
status.json cannot be read is "damaged" with the reason; Resume uses the newest checkpoint that passes
`checkpoint_problem`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import shutil
import time
import zipfile
from pathlib import Path

import psutil

from grpo_app.core.config import PROJECT_ROOT, Config, ConfigError, config_from_dict, read_yaml_file
from grpo_app.core.fileio import (
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    clean_json,
    read_json,
    read_json_object,
    read_jsonl,
    safetensors_header,
)

ACTIVE = ("running", "stopping")
STEPS_MAX_BYTES = 32 * 2**20  # steps.jsonl: ~2000 steps of 4 prompts x 8 completions of ~100 tokens
STEPS_MAX_CHARS = 1500  # characters kept of each completion in steps.jsonl
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,100}$")


# ------------------------------------------------------------------------------------------------
# Run folders
# ------------------------------------------------------------------------------------------------
def runs_root(cfg_root: str | None = None) -> Path:
    """Where runs live: GRPO_APP_RUNS_DIR (a server setting) wins over a config's run.output_dir."""
    root = os.environ.get("GRPO_APP_RUNS_DIR") or cfg_root or "models/runs"
    p = Path(root)
    if not p.is_absolute():
        p = PROJECT_ROOT / p
    return p.resolve()


def read_anchor(path) -> dict:
    """The EWC anchor kept in an ewc.safetensors file: the trainable weights as its stage ended, by name."""
    from safetensors.torch import load_file

    return {n.split("::", 1)[1]: t for n, t in load_file(str(path)).items() if n.startswith("anchor::")}


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.id = self.path.name

    # paths
    config_path = property(lambda self: self.path / "config.yaml")
    status_path = property(lambda self: self.path / "status.json")
    metrics_path = property(lambda self: self.path / "metrics.jsonl")
    events_path = property(lambda self: self.path / "events.jsonl")
    memory_path = property(lambda self: self.path / "memory.jsonl")
    step_path = property(lambda self: self.path / "latest_step.json")
    steps_path = property(lambda self: self.path / "steps.jsonl")
    trained_path = property(lambda self: self.path / "trained_problems.jsonl")
    checkpoints_dir = property(lambda self: self.path / "checkpoints")
    ewc_dir = property(lambda self: self.path / "ewc")
    final_dir = property(lambda self: self.path / "final")
    eval_dir = property(lambda self: self.path / "eval")
    stage_ends_dir = property(lambda self: self.path / "stage_ends")

    def stage_end_weights(self, k: int) -> tuple[str, Path] | None:
        """Where the weights the run had when its stage k ended are: ("anchor", ewc.safetensors) — the EWC
        anchor, its trainable weights — or ("weights", stage_ends/stage-K.safetensors) for a run without EWC,
        or ("final", final/) for the last stage; None when the run has not (yet) kept them."""
        n = len(self.config().stages)
        if k == n - 1 and self.has_final_model():
            return "final", self.final_dir
        own = self.stage_ends_dir / f"stage-{k}.safetensors"
        if own.is_file():
            return "weights", own
        anchor = self.ewc_dir / f"stage-{k}" / "ewc.safetensors"
        if anchor.is_file():
            return "anchor", anchor
        return None

    def stage_end_state(self, k: int) -> dict | None:
        """The trainable weights (name -> tensor) the run had when stage k ended, read from the EWC anchor or
        stage_ends/; None when the run kept neither (the last stage's are the final model)."""
        from safetensors.torch import load_file

        where = self.stage_end_weights(k)
        if where is None or where[0] == "final":
            return None
        kind, path = where
        return load_file(str(path)) if kind == "weights" else read_anchor(path)

    @classmethod
    def create(cls, root: Path, cfg: Config) -> RunDir:
        root.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        base = f"{stamp}-{cfg.run.name or cfg.preset or 'run'}"
        base = re.sub(r"[^A-Za-z0-9_\-]+", "-", base)[:80]
        rid, i = base, 1
        while (root / rid).exists():
            i += 1
            rid = f"{base}-{i}"
        path = root / rid
        path.mkdir(parents=True)
        rd = cls(path)
        atomic_write_text(rd.config_path, cfg.to_yaml())
        rd.write_status(status="created", total_steps=cfg.total_steps, stages=len(cfg.stages))
        return rd

    def config(self) -> Config:
        return config_from_dict(read_yaml_file(self.config_path, "config.yaml"))

    # status
    def read_status(self) -> dict:
        """status.json's fields; a field of the wrong type (a damaged or hand-edited file) is left out."""
        return _typed(read_json_object(self.status_path) or {}, STATUS_FIELDS)

    def damage(self) -> str | None:
        """Why this run cannot be read as a run (its config or its status), or None. Cheap: the config is
        parsed again only when config.yaml changed."""
        problem = self._config_problem()
        if problem is None and self.status_path.exists():
            raw = read_json(self.status_path, _UNREADABLE)
            if not isinstance(raw, dict):
                problem = "status.json is not a JSON object" + (" (or not UTF-8 text)" if raw is _UNREADABLE else "")
            elif bad := [k for k in STATUS_FIELDS if k in raw and k not in _typed(raw, STATUS_FIELDS)]:
                problem = f"status.json: {', '.join(bad[:3])} of the wrong type"
        return problem

    def _config_problem(self) -> str | None:
        try:
            st = self.config_path.stat()
        except OSError:
            return "config.yaml is missing"
        key = (str(self.config_path), st.st_mtime_ns, st.st_size)
        problem = _CONFIG_PROBLEMS.get(key, _UNREADABLE)
        if problem is _UNREADABLE:
            try:
                self.config()
                problem = None
            except ConfigError as e:
                problem = "config.yaml: " + "; ".join(f"{w}: {m}" for w, m in e.errors[:2])[:300]
            if len(_CONFIG_PROBLEMS) > 256:
                _CONFIG_PROBLEMS.clear()
            _CONFIG_PROBLEMS[key] = problem
        return problem

    def write_status(self, **fields) -> dict:
        st = self.read_status()
        st.update(fields)
        st["updated"] = time.time()
        atomic_write_json(self.status_path, st)
        return st

    def effective_status(self) -> str:
        """The stored status, except a 'running' run whose process is gone is 'interrupted', and a run whose
        config or status cannot be read is 'damaged' (`damage()` says why)."""
        if self.damage() is not None:
            return "damaged"
        st = self.read_status()
        status = st.get("status", "unknown")
        if status in ACTIVE + ("created",) and not _process_alive(st.get("pid"), st.get("pid_started")):
            return "interrupted"
        return status

    # records
    def append_metric(self, rec: dict) -> None:
        append_jsonl(self.metrics_path, rec)

    def append_event(self, kind: str, **data) -> dict:
        ev = {"time": time.time(), "event": kind, **data}
        append_jsonl(self.events_path, ev)
        return ev

    def metrics(self, skipped: list | None = None) -> list[dict]:
        """The logged steps; a line that is not a JSON object or whose fields have the wrong types is left out
        (and counted in `skipped`)."""
        return _records(self.metrics_path, METRIC_FIELDS, ("step",), skipped)

    def events(self) -> list[dict]:
        return _records(self.events_path, EVENT_FIELDS, ("event",))

    def memory(self) -> list[dict]:
        return _records(self.memory_path, MEMORY_FIELDS, ("time", "rss_mb"))

    def latest_step(self) -> dict | None:
        """latest_step.json when it has the shape the step view draws, else None."""
        return clean_step(read_json(self.step_path))

    def append_step(self, snapshot: dict, max_bytes: int = STEPS_MAX_BYTES, max_chars: int = STEPS_MAX_CHARS) -> None:
        """Add one step's groups to steps.jsonl (see the layout above for the bound and what happens past it)."""
        append_jsonl(self.steps_path, step_record(snapshot, max_chars))
        try:
            size = self.steps_path.stat().st_size
        except OSError:
            return
        if size > max_bytes:
            self._thin_steps(max_bytes)

    def append_trained(self, step: int, stage: int, problems: list[tuple[str, str]]) -> None:
        """Record that `step` (of stage `stage`) trained on `problems` ([(id, question)]): complete, never thinned."""
        append_jsonl(self.trained_path, {"step": int(step), "stage": int(stage),
                                         "problems": [[str(i), str(q)] for i, q in problems]})

    def trained_questions(self) -> set[str] | None:
        """Every question a step of this run trained on, or None when the run has no record of them (a run from
        before the record, or one that never finished a step's sampling)."""
        if not self.trained_path.is_file():
            return None
        out: set[str] = set()
        for rec in read_jsonl(self.trained_path):
            for item in rec.get("problems") or []:
                if isinstance(item, list) and len(item) == 2 and isinstance(item[1], str):
                    out.add(item[1])
        return out

    def _thin_steps(self, max_bytes: int) -> None:
        lines = [json.dumps(clean_json(r)) + "\n" for r in self.steps()]
        size = sum(len(x.encode()) for x in lines)
        while size > max_bytes * 3 // 4 and len(lines) > 2:
            half = len(lines) // 2
            older = lines[1:half]
            if not older:  # two or three huge steps: keep the first and the latest
                lines = [lines[0], lines[-1]]
            else:
                lines = [lines[0], *older[1::2], *lines[half:]]
            size = sum(len(x.encode()) for x in lines)
        if size > max_bytes and len(lines) > 1:
            lines = lines[-1:]
        atomic_write_text(self.steps_path, "".join(lines))

    def steps(self) -> list[dict]:
        """Every recorded step (steps.jsonl), oldest first; a step written twice (resume) counts once, last wins."""
        by_step: dict[int, dict] = {}
        for rec in read_jsonl(self.steps_path):
            if isinstance(rec.get("step"), int) and isinstance(rec.get("groups"), list):
                by_step[rec["step"]] = rec
        return [by_step[k] for k in sorted(by_step)]

    def truncate_metrics_after(self, step: int) -> int:
        """Drop metric lines past `step` (they will be recomputed on resume); returns how many were dropped."""
        recs = self.metrics()
        keep = [r for r in recs if r.get("step", 0) <= step]
        atomic_write_text(self.metrics_path, "".join(json.dumps(clean_json(r)) + "\n" for r in keep))
        return len(recs) - len(keep)

    def has_final_model(self) -> bool:
        """A trained model in final/: a real folder of this run (a symlink to elsewhere does not count)."""
        final = self.final_dir
        return not final.is_symlink() and final.resolve().parent == self.path.resolve() and (final / "config.json").is_file()

    # checkpoints
    def checkpoints(self) -> list[dict]:
        """Complete checkpoints (with COMPLETE marker and engine_state.json), oldest first."""
        out = []
        if not self.checkpoints_dir.is_dir():
            return out
        for stage_dir in self.checkpoints_dir.glob("stage-*"):
            for ck in stage_dir.glob("checkpoint-*"):
                state = _typed(read_json_object(ck / "engine_state.json") or {}, _CHECKPOINT_FIELDS)
                if (ck / "COMPLETE").is_file() and all(isinstance(state.get(k), int) for k in _CHECKPOINT_FIELDS):
                    out.append({**state, "path": str(ck)})
        out.sort(key=lambda s: (s["stage_index"], s["stage_step"]))
        return out

    def latest_checkpoint(self) -> dict | None:
        """The newest complete checkpoint that passes `checkpoint_problem` (a truncated or damaged newer one is
        passed over, so Resume continues from the one before it)."""
        for ck in reversed(self.checkpoints()):
            if checkpoint_problem(Path(ck["path"])) is None:
                return ck
        return None

    def damaged_checkpoints(self) -> list[tuple[str, str]]:
        """(name, why) of complete checkpoints newer than `latest_checkpoint()` that would not load."""
        out = []
        for ck in reversed(self.checkpoints()):
            problem = checkpoint_problem(Path(ck["path"]))
            if problem is None:
                break
            out.append((Path(ck["path"]).name, problem))
        return out

    def prune_checkpoints(self, keep: int) -> None:
        """Keep the newest `keep` checkpoints that load (a damaged one never counts as kept)."""
        good = [ck for ck in self.checkpoints() if checkpoint_problem(Path(ck["path"])) is None]
        for ck in good[:-keep] if keep > 0 else []:
            shutil.rmtree(ck["path"], ignore_errors=True)

    def summary(self) -> dict:
        """One line about the run for lists; a damaged run is listed with status 'damaged' and the reason."""
        st = self.read_status()
        skipped: list = []
        metrics = self.metrics(skipped)
        last = metrics[-1] if metrics else {}
        try:
            cfg = self.config()
            preset, stages = cfg.preset, " → ".join(s.name for s in cfg.stages)
            model = cfg.model.name
        except ConfigError:
            preset, stages, model = "?", "?", "?"
        status = self.effective_status()
        damage = self.damage()
        if skipped:
            damage = "; ".join(filter(None, [damage, f"metrics.jsonl: {len(skipped)} damaged lines skipped"]))
        started = st.get("started")
        ended = st.get("ended") or (st.get("updated") if status != "running" else time.time())
        return {
            "run_id": self.id,
            "status": status,
            "preset": preset,
            "model": model,
            "stages": stages,
            "steps": f"{last.get('step', 0)}/{st.get('total_steps', '?')}",
            "final_reward": last.get("reward"),
            "duration_s": (ended - started) if started and ended else None,
            "started": started,
            "has_final": self.has_final_model(),
            "error": damage or st.get("error"),
            "damage": damage,
        }


# ------------------------------------------------------------------------------------------------
# What readers may rely on in a record from disk. A file edited by hand, copied in part or damaged can hold
# valid JSON of the wrong shape; a record whose known field has the wrong type is left out (a status field is
# dropped), so no view meets text where it computes with a number. Unknown fields pass as they are.
# ------------------------------------------------------------------------------------------------
def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 1e15


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1e15


def _text(v) -> bool:
    return isinstance(v, str)


def _number_map(v) -> bool:
    return isinstance(v, dict) and all(x is None or _number(x) for x in v.values())


STATUS_FIELDS = {
    **dict.fromkeys(("status", "phase", "error", "stage_name"), _text),
    **dict.fromkeys(("started", "ended", "updated", "pid_started", "peak_rss_mb"), _number),
    **dict.fromkeys(("total_steps", "stages", "pid", "stage", "step", "stage_step"), _whole),
}
METRIC_FIELDS = {
    "step": _whole,
    "stage": _whole,
    "stage_step": _whole,
    "stage_name": _text,
    "rewards": _number_map,
    **dict.fromkeys(
        (
            "time elapsed reward reward_std frac_zero_std loss kl ewc_penalty ewc_seconds entropy completion_length "
            "truncated_ratio stopped_at_answer forced_answer_line skipped_zero_adv grad_norm lr step_seconds gen_seconds tokens_per_s "
            "gen_tokens_per_s completions_per_s rss_mb"
        ).split(),
        _number,
    ),
}
EVENT_FIELDS = {
    **dict.fromkeys(
        "event name origin device precision model message traceback checkpoint source path".split(), _text
    ),
    **dict.fromkeys(
        (
            "time stage step steps stage_step samples problems parameters trainable threads n seconds "
            "base_accuracy trained_accuracy p_value dropped_metric_lines replayed"
        ).split(),
        _number,
    ),
}
MEMORY_FIELDS = {"time": _number, "rss_mb": _number}
_CHECKPOINT_FIELDS = {"stage_index": _whole, "stage_step": _whole, "global_step": _whole}
_UNREADABLE = object()
_CONFIG_PROBLEMS: dict[tuple, str | None] = {}


def _typed(rec: dict, fields: dict) -> dict:
    """`rec` without the known fields whose values have the wrong type (None is always allowed)."""
    return {k: v for k, v in rec.items() if k not in fields or v is None or fields[k](v)}


def _records(path: Path, fields: dict, required: tuple, skipped: list | None = None) -> list[dict]:
    """The JSONL records of `path` that have every `required` field and no known field of the wrong type;
    each line left out (not an object, not JSON, the wrong shape) is added to `skipped` when given."""
    out = []
    bad: list = [] if skipped is None else skipped
    for rec in read_jsonl(path, bad):
        if all(rec.get(k) is not None for k in required) and len(_typed(rec, fields)) == len(rec):
            out.append(rec)
        else:
            bad.append(rec)
    return out


def clean_step(step) -> dict | None:
    """A latest-step record when its groups have the shape the step view draws (texts, per-reward lists,
    totals and advantages as long as the completions), else None."""
    if not isinstance(step, dict) or not isinstance(step.get("groups"), list):
        return None
    if not all(step.get(k) is None or _whole(step[k]) for k in ("step", "stage", "stage_step")):
        return None
    if not (step.get("weights") is None or _number_map(step["weights"])):
        return None
    for g in step["groups"]:
        if not isinstance(g, dict):
            return None
        comps = g.get("completions", [])
        if not isinstance(comps, list) or not all(isinstance(c, str) for c in comps):
            return None
        n = len(comps)
        lists = [g.get("totals", [] if n == 0 else None), g.get("advantages", [0.0] * n)]
        rewards = g.get("rewards", {})
        if not isinstance(rewards, dict):
            return None
        lists += list(rewards.values())
        if not all(isinstance(v, list) and len(v) >= n and all(x is None or _number(x) for x in v) for v in lists):
            return None
        if not all(g.get(k) is None or _number(g[k]) for k in ("mean", "std")):
            return None
    return step


def checkpoint_problem(folder: Path) -> str | None:
    """Why a complete checkpoint would not load, from cheap checks (None if it looks whole): its weights
    (each .safetensors file as long as its header says), its trainer state (a JSON object) and the torch
    files of the optimizer, scheduler and RNG (zip archives whose directory, at their end, is readable)."""
    folder = Path(folder)
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return "no model weights (model.safetensors)"
    for f in weights:
        if safetensors_header(f) is None:
            return f"{f.name} is truncated or damaged"
    if read_json_object(folder / "trainer_state.json") is None:
        return "trainer_state.json is missing or damaged"
    for f in sorted([*folder.glob("*.pt"), *folder.glob("*.pth"), *folder.glob("*.bin")]):
        try:
            with zipfile.ZipFile(f):
                pass
        except (OSError, zipfile.BadZipFile):
            return f"{f.name} is truncated or damaged"
    return None


def step_record(snapshot: dict, max_chars: int = STEPS_MAX_CHARS) -> dict:
    """One steps.jsonl line from a step snapshot (`trainer._emit_groups` + the engine's stage fields):
    completions cut to `max_chars` characters (counted in 'clipped'), the system prompt left out. A group with
    forced answer-line hints keeps their spans ('forced', cut with the text) and the record the loss mode."""
    clipped = 0

    def cut(text) -> str:
        nonlocal clipped
        text = str(text)
        if len(text) > max_chars:
            clipped += 1
            return text[:max_chars] + "…"
        return text

    def span(s):  # trainer.py, departure 8: where the hint was written, as far as the cut text holds it
        if not (isinstance(s, (list, tuple)) and len(s) == 2):
            return None
        a, b = int(s[0]), min(int(s[1]), max_chars)
        return [a, b] if 0 <= a < b else None

    def spans(forced) -> dict:
        kept = [span(s) for s in forced or []]
        return {"forced": kept} if any(kept) else {}

    groups = [
        {
            "problem_id": g.get("problem_id", ""),
            "question": g.get("question", ""),
            "answer": g.get("answer", ""),
            "completions": [cut(c) for c in g.get("completions") or []],
            **{k: g[k] for k in ("difficulty", "rewards", "totals", "mean", "std", "advantages") if k in g},
            **spans(g.get("forced")),
        }
        for g in snapshot.get("groups") or []
    ]
    keys = ("step", "stage", "stage_name", "stage_step", "weights", "scale_rewards", "forced_loss")
    rec = {k: snapshot[k] for k in keys if k in snapshot}
    return {**rec, "time": time.time(), "groups": groups, "clipped": clipped}


def _process_alive(pid, started) -> bool:
    if not pid:
        return False
    try:
        p = psutil.Process(int(pid))
        if started is not None and abs(p.create_time() - float(started)) > 1.0:
            return False  # the pid was reused by another process
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def validate_run_id(run_id: str) -> str:
    run_id = (run_id or "").strip() if isinstance(run_id, str) else ""
    if not RUN_ID_RE.match(run_id) or ".." in run_id:
        raise ValueError(f"'{run_id[:40]}' is not a run id (letters, digits, '-' and '_').")
    return run_id


def _real_run_folder(root: Path, path: Path) -> bool:
    """A real folder (not a symlink) directly under `root` (resolved), holding a config.yaml that is a file."""
    try:
        return (
            not path.is_symlink()
            and path.is_dir()
            and path.resolve().parent == root
            and not (path / "config.yaml").is_symlink()
            and (path / "config.yaml").is_file()
        )
    except OSError:
        return False


def resolve_run(root: Path, run_id: str) -> RunDir:
    """The run `run_id` under the runs folder `root`, or ValueError. The one rule for a run id from a page or
    the command line: a valid id naming a real folder directly under the resolved root. A symlinked run folder
    (or one that resolves elsewhere) is refused, so no file outside the runs folder is served or loaded."""
    run_id = validate_run_id(run_id)
    root = Path(root).resolve()
    path = root / run_id
    if not _real_run_folder(root, path):
        raise ValueError(f"There is no run '{run_id}'.")
    return RunDir(path)


def list_runs(root: Path) -> list[RunDir]:
    """The run folders under `root`, newest first; symlinked folders are left out (see `resolve_run`)."""
    try:
        root = Path(root).resolve()
        if not root.is_dir():
            return []
        runs = [RunDir(p) for p in root.iterdir() if RUN_ID_RE.match(p.name) and _real_run_folder(root, p)]
    except OSError:
        return []
    runs.sort(key=lambda r: r.id, reverse=True)
    return runs
