"""The state every page shares, and the actions pages ask for (no Gradio import).

One `Studio` per server holds the `RunManager` (the one training job), the evaluation queue, the
models loaded for the Try tab, and small caches that keep the page cheap for a room full of
watchers: the current run view is computed at most every `view_ttl` seconds for everybody; each
chart, the status answer, the status line and the run log are built once per change of the run
(`monitor` version markers) and handed to every page ready-made (only the elapsed time moves with
the clock). The Gradio tabs only translate components to these calls.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from grpo_app.core.config import CONFIG_DIR, ConfigError, DataConfig
from grpo_app.core.data import DataError, load_gsm8k, make_arithmetic, parse_custom_dataset
from grpo_app.core.env import env_int
from grpo_app.core.fileio import read_json
from grpo_app.core.models import allowed_model_roots, model_label
from grpo_app.core.run_folder import RunDir
from grpo_app.evaluation.ask import ModelCache, check_gold, check_question
from grpo_app.runs.job_queue import JobQueue
from grpo_app.runs.manager import RunInProgressError, RunManager
from grpo_app.runs.monitor import current_view, disk_view, job_start, live_view, progress, resume_target
from grpo_app.ui import forms, render
from grpo_app.ui.charts import difficulty_figure, memory_figure, training_figures
from grpo_app.ui.forms import FormError, TrainForm

log = logging.getLogger("grpo_app.ui")


@dataclass
class Limits:
    """What one request may ask of this server (environment variables override the defaults)."""

    max_upload_mb: int = field(default_factory=lambda: env_int("GRPO_APP_MAX_UPLOAD_MB", 5, 1, 20))
    max_eval_n: int = field(default_factory=lambda: env_int("GRPO_APP_MAX_EVAL_N", 500, 1, 5000))
    max_eval_tokens: int = 1024
    max_pass_k: int = field(default_factory=lambda: env_int("GRPO_APP_MAX_PASS_K", 16, 1, 64))
    max_try_tokens: int = 512
    eval_pending: int = field(default_factory=lambda: env_int("GRPO_APP_EVAL_QUEUE", 3, 1, 50))
    eval_idle_s: float = 90.0


@dataclass
class Result:
    """What an action tells the page: ok or not, a message, and messages per form control."""

    ok: bool
    message: str
    errors: dict = field(default_factory=dict)
    run_id: str | None = None


class ViewCache:
    """`monitor.current_view`, recomputed at most every `ttl` seconds for all pages together."""

    def __init__(self, manager: RunManager, ttl: float = 0.5):
        self.manager, self.ttl = manager, ttl
        self._lock = threading.Lock()
        self._view: dict | None = None
        self._at = 0.0

    def get(self) -> dict:
        with self._lock:
            now = time.monotonic()
            if self._view is None or now - self._at >= self.ttl:
                self._view = current_view(self.manager)
                self._at = now
            return self._view

    def invalidate(self) -> None:
        with self._lock:
            self._view = None


class FigureCache:
    """Plotly JSON per (what it shows, version); built once, served to every page."""

    def __init__(self, size: int = 24):
        self._items: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self._build = threading.Lock()
        self.size = size
        self.builds = 0

    def get(self, key, build):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        with self._build:  # one builder at a time: twenty pages asking at once build it once
            with self._lock:
                if key in self._items:
                    return self._items[key]
            value = build()
            self.builds += 1
            with self._lock:
                self._items[key] = value
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
            return value


TRAIN_CHARTS = ("reward", "loss", "length", "memory", "throughput")
MEMORY_BUILD_S = 5.0  # a live run's memory chart is rebuilt at most this often for all pages (see chart_json)


# ------------------------------------------------------------------------------------------------
# The studio
# ------------------------------------------------------------------------------------------------
class Studio:
    def __init__(
        self,
        manager: RunManager | None = None,
        runs_dir: str | Path | None = None,
        configs_dir: str | Path | None = None,
        default_preset: str | None = None,
        limits: Limits | None = None,
        view_ttl: float = 0.5,
    ):
        self.manager = manager or RunManager(runs_dir)
        self.limits = limits or Limits()
        self.configs_dir = Path(configs_dir or os.environ.get("GRPO_APP_CONFIGS_DIR") or CONFIG_DIR).resolve()
        self.presets = self._find_presets(default_preset or os.environ.get("GRPO_APP_DEFAULT_PRESET"))
        self.default_preset = self._default_preset_name(default_preset or os.environ.get("GRPO_APP_DEFAULT_PRESET"))
        self.views = ViewCache(self.manager, ttl=view_ttl)
        self.figures = FigureCache()
        self.answers = FigureCache(size=16)  # status answers, status lines and run logs, per run version
        self.evals = JobQueue(max_pending=self.limits.eval_pending, idle_timeout=self.limits.eval_idle_s, name="eval")
        self.models = ModelCache(capacity=2)
        self.uploads_dir = self.manager.root.parent / "uploads"
        self._problems: list[dict] | None = None

    # ---- presets --------------------------------------------------------------------------------
    def _find_presets(self, extra: str | None) -> dict[str, Path]:
        found = {p.stem: p for p in sorted(self.configs_dir.glob("*.yaml"))}
        if extra and extra.endswith((".yaml", ".yml")) and Path(extra).is_file():
            found.setdefault(Path(extra).stem, Path(extra).resolve())
        return found

    def _default_preset_name(self, wanted: str | None) -> str:
        if wanted:
            stem = Path(wanted).stem
            if stem in self.presets:
                return stem
        for name in ("classroom", "quick"):
            if name in self.presets:
                return name
        return next(iter(self.presets), "")

    def preset_data(self, name) -> dict:
        if not isinstance(name, str) or name not in self.presets:
            known = ", ".join(self.presets) or "none"
            raise FormError([("preset", f"unknown preset {name!r}; pick one of: {known}.")])
        try:
            return forms.load_preset_data(self.presets[name])
        except ConfigError as e:
            raise FormError([("preset", f"{name}: {m}") for _, m in e.errors]) from None

    def preset_form(self, name) -> tuple[dict, str]:
        """(form values, description) of a preset."""
        from grpo_app.core.config import config_from_dict

        data = self.preset_data(name)
        try:
            cfg = config_from_dict(data)
        except ConfigError as e:
            raise FormError([("preset", f"{name}: {p}: {m}") for p, m in e.errors]) from None
        return forms.form_values(cfg), cfg.description

    # ---- model names --------------------------------------------------------------------------
    def model_roots(self) -> list[Path]:
        roots = [*allowed_model_roots(), self.manager.root.resolve()]
        return list(dict.fromkeys(roots))

    def check_model(self, name, check_hub: bool = True) -> str:
        resolved, problem = forms.check_model_name(name, self.model_roots(), self.manager.root)
        if problem is None and check_hub:
            problem = forms.hub_model_problem(resolved)
        if problem:
            raise FormError([("model.name", problem)])
        return resolved

    # ---- uploads --------------------------------------------------------------------------------
    def check_upload(self, path) -> tuple[str, str]:
        """(saved path, message) for an uploaded JSONL/CSV; raises FormError('upload', ...) when it is bad."""
        if not path:
            raise FormError([("upload", "no file was uploaded.")])
        p = Path(str(path))
        if not p.is_file():
            raise FormError([("upload", "the uploaded file is gone; upload it again.")])
        limit = self.limits.max_upload_mb * 2**20
        size = p.stat().st_size
        name = p.name
        if size > limit:
            raise FormError(
                [("upload", f"{name}: {size / 2**20:.1f} MB is over the {self.limits.max_upload_mb} MB limit.")]
            )
        raw = p.read_bytes()
        try:
            problems = parse_custom_dataset(raw, name)
        except DataError as e:
            raise FormError([("upload", str(e))]) from None
        digest = hashlib.sha256(raw).hexdigest()[:12]
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in p.name)[-60:]
        target = self.uploads_dir / f"{digest}-{safe}"
        if not target.is_file():
            self.uploads_dir.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_bytes(raw)
            os.replace(tmp, target)
        levels = sorted({q.difficulty for q in problems})
        msg = (
            f"✓ **{_md(name)}**: {len(problems)} problems (difficulty {levels[0]}–{levels[-1]}). "
            "Stages with source **custom** train on it."
        )
        return str(target), msg

    # ---- training -------------------------------------------------------------------------------
    def start(self, form: TrainForm, upload=None) -> Result:
        try:
            data = self.preset_data(form.preset)
            if upload:
                form.custom_path, _ = self.check_upload(upload)
            cfg = forms.build_config(form, data, self.model_roots(), self.manager.root)
        except FormError as e:
            return Result(False, forms.errors_md(e.errors), forms.route_errors(e.errors))
        try:
            run = self.manager.start(cfg)
        except RunInProgressError as e:
            return Result(False, f"**A run is in progress** — {e} Watch it below, or press **Stop** first.")
        except ConfigError as e:
            return Result(False, forms.errors_md(e.errors), forms.route_errors(e.errors))
        finally:
            self.views.invalidate()
        notes = "".join(f"\n\nNote: {n}" for n in form.notes)
        return Result(
            True,
            f"Started run **{run.id}**: {len(cfg.stages)} stages, {cfg.total_steps} steps. "
            f"The charts below follow it live.{notes}",
            run_id=run.id,
        )

    def stop(self) -> Result:
        try:
            if self.manager.stop():
                rid = self.manager.current_run.id if self.manager.current_run else "?"
                phase = self.manager.snapshot()["status"].get("phase") or "stopping"
                return Result(
                    True,
                    f"Stopping **{rid}** — {_md(phase)}. The last complete step stays as a checkpoint you can "
                    "resume.",
                    run_id=rid,
                )
            return Result(False, "No run is training on this server, so there is nothing to stop.")
        finally:
            self.views.invalidate()

    def resume(self, run_id=None) -> Result:
        try:
            if run_id is not None and not isinstance(run_id, str):
                return Result(False, f"{run_id!r} is not a run id.")
            if run_id and run_id.strip():
                try:
                    run = self.manager.get(run_id)
                except ValueError as e:
                    return Result(False, str(e))
            else:
                if self.manager.active:
                    return Result(False, "**A run is in progress**; nothing to resume.")
                run = resume_target(self.manager)
                if run is None:
                    return Result(False, "No stopped or interrupted run with a checkpoint to resume.")
            try:
                self.manager.resume(run.id)
            except RunInProgressError as e:
                return Result(False, f"**A run is in progress** — {e}")
            except ValueError as e:
                return Result(False, str(e))
            ck = run.latest_checkpoint() or {}
            return Result(True, f"Resumed **{run.id}** from step {ck.get('global_step', '?')}.", run_id=run.id)
        finally:
            self.views.invalidate()

    def view(self) -> dict:
        return self.views.get()

    def status(self, view: dict | None = None) -> dict:
        """JSON-ready status of the run the Train tab shows. Computed once per version of the run for every
        page (`answers`); only a running job's elapsed time is brought up to the clock per request."""
        view = view or self.view()
        answer, start = self.answers.get(("status", view["version"]), lambda: self._status_answer(view))
        out = dict(answer)
        if view.get("active") and start:
            out["elapsed_s"] = max(0.0, time.time() - start)
        return out

    @staticmethod
    def _status_answer(view: dict) -> tuple[dict, float | None]:
        p = progress(view)
        last = view["metrics"][-1] if view["metrics"] else {}
        answer = {
            **p,
            "active": bool(view.get("active")),
            "steps_recorded": len(view["metrics"]),
            "last_step": last.get("step"),
            "reward": last.get("reward"),
            "rewards": last.get("rewards") or {},
            "loss": last.get("loss"),
            "rss_mb": last.get("rss_mb"),
            "latest_step_groups": len((view.get("latest_step") or {}).get("groups") or []),
        }
        return answer, job_start(view)

    def status_line(self, view: dict) -> str:
        """The Train tab's status line (HTML), built once per (version, elapsed second) for every page."""
        st = self.status(view)
        second = int(st["elapsed_s"]) if st.get("elapsed_s") is not None else None
        return self.answers.get(("line", view["version"], second), lambda: render.status_html(st))

    @staticmethod
    def memory_mark(view: dict, every_s: float) -> str:
        """Changes when the memory chart is worth redrawing: samples arrive every 0.5 s, a page redraws
        them at most every `every_s` seconds (and with each step)."""
        mv = view.get("mem_version")
        if view.get("live") and view.get("active"):
            return repr((view.get("run_id"), int(time.time() // every_s) if mv and mv[-1] else 0))
        return repr(mv)

    def events_md(self, view: dict) -> str:
        """The run log (Markdown), once per version for every page."""
        return self.answers.get(("events", view["charts_version"]), lambda: render.events_md(view.get("events") or []))

    def chart_json(self, view: dict, names=TRAIN_CHARTS) -> dict[str, str]:
        """Plotly JSON of the training charts of `view`, built once per `charts_version` for every page."""
        rev = view.get("run_id") or "none"
        events = view.get("events") or []

        def build_steps():
            return {name: fig.to_json() for name, fig in training_figures(view, memory=False).items()}

        def build_memory():
            return memory_figure(view.get("memory") or [], events, view.get("started"), rev).to_json()

        out = dict(self.figures.get(("train", view["charts_version"]), build_steps))
        if "memory" in names:
            mv = view.get("mem_version")
            if view.get("live") and view.get("active"):
                # samples arrive every 0.5 s and pages redraw the chart every 5 s or more, each at its own moment:
                # keyed by the samples, every page's draw built it anew (~0.1-0.2 s of CPU each on a slow host as a
                # validated Plotly figure, ~0.01 s as plain dicts, taken from the training); one build per
                # MEMORY_BUILD_S serves them all, at most that much older
                mv = (rev, "live", int(time.monotonic() // MEMORY_BUILD_S))
            out["memory"] = self.figures.get(("memory", rev, mv, len(events)), build_memory)
        return {k: out[k] for k in names}

    # ---- comparisons ---------------------------------------------------------------------------
    def run_with_model(self, run_id) -> RunDir:
        if not isinstance(run_id, str) or not run_id.strip():
            raise FormError([("run", "pick a run (its trained model is compared with its base model).")])
        try:
            run = self.manager.get(run_id)
        except ValueError as e:
            raise FormError([("run", str(e))]) from None
        if not run.has_final_model():
            raise FormError([("run", f"run '{run.id}' has no trained model yet (a run saves one when it completes).")])
        return run

    def compare_spec(
        self, mode, run_id, base, trained, eval_set, n, dmin, dmax, seed, max_tokens, pass_k=0, pass_temperature=1.0
    ):
        """The form's values as an `evaluation.CompareSpec`, or a FormError listing every problem."""
        from grpo_app.evaluation.scoring import CompareSpec

        errors: list = []
        pass_k = forms.parse_int(pass_k, "pass_k", "pass@k samples", errors, 0, self.limits.max_pass_k)
        if pass_k:
            pass_temperature = forms.parse_float(pass_temperature, "pass_k", "pass@k temperature", errors, 0.05, 2.0)
        n = forms.parse_int(n, "n", "N (problems)", errors, 1, self.limits.max_eval_n)
        seed = forms.parse_int(seed, "seed", "seed", errors, 0, forms.MAX_SEED)
        dmin = forms.parse_int(dmin, "difficulty", "min difficulty", errors, 0, forms.MAX_DIFFICULTY)
        dmax = forms.parse_int(dmax, "difficulty", "max difficulty", errors, 0, forms.MAX_DIFFICULTY)
        tokens = forms.parse_int(max_tokens, "max_tokens", "max answer tokens", errors, 16, self.limits.max_eval_tokens)
        if dmin is not None and dmax is not None and dmax < dmin:
            errors.append(("difficulty", f"the difficulty range {dmin}..{dmax} is empty (max below min)."))
        eval_set = eval_set if isinstance(eval_set, str) else ""
        if eval_set != "gsm8k" and not eval_set.startswith("stage:"):
            errors.append(("eval_set", f"unknown problem set {eval_set[:40]!r}; use 'gsm8k' or 'stage:<k>'."))
        run = None
        names: dict[str, str] = {}
        if mode == "run":
            try:
                run = self.run_with_model(run_id)
            except FormError as e:
                errors += e.errors
        elif mode == "models":
            if eval_set != "gsm8k":
                errors.append(("eval_set", "held-out stage problems need a run: pick 'A run vs its base model'."))
            for role, name in (("base", base), ("trained", trained)):
                try:
                    names[role] = self.check_model(name)
                except FormError as e:
                    errors.append((role, f"{role} model: {e.errors[0][1]}"))
        else:
            errors.append(("mode", f"unknown mode {str(mode)[:40]!r}; use 'run' or 'models'."))
        if errors:
            raise FormError(errors)
        try:
            if run is not None:
                spec = CompareSpec.for_run(run, eval_set, n, seed, tokens, dmin, dmax)
            else:
                spec = CompareSpec.for_models(names["base"], names["trained"], n, seed, tokens, dmin, dmax)
            return spec.with_pass_k(pass_k, pass_temperature) if pass_k else spec
        except ValueError as e:
            raise FormError([("eval_set" if "stage" in str(e) or "problem set" in str(e) else "settings", str(e))]) from None

    def submit_compare(self, spec, watcher: str | None = None):
        """Queue the comparison (or join the same one already queued); returns the Job."""
        from grpo_app.evaluation.scoring import run_compare

        def work(report, should_stop):
            return run_compare(spec, report, should_stop)

        return self.evals.submit(work, label=spec.label(), key=spec.key(), watcher=watcher)

    # ---- the stage x task matrix (Compare tab) ----------------------------------------------------
    def submit_matrix(self, run_id, other_id, n, seed, watcher: str | None = None):
        """Queue the stage x task matrix of a run (and of a second run beside it, e.g. the same preset without
        EWC); returns the Job, whose result is {"runs": [(run id, matrix), ...]}. FormError on bad input."""
        from grpo_app.evaluation.stage_matrix import MatrixError, stage_matrix

        errors: list = []
        n = forms.parse_int(n, "n", "N (problems per task)", errors, 1, self.limits.max_eval_n)
        seed = forms.parse_int(seed, "seed", "seed", errors, 0, forms.MAX_SEED)
        runs = []
        for role, rid in (("run", run_id), ("other", other_id)):
            if role == "other" and (not isinstance(rid, str) or not rid.strip() or rid == run_id):
                continue
            try:
                runs.append(self.run_with_model(rid))
            except FormError as e:
                errors += [(role, f"{'beside it: ' if role == 'other' else ''}{msg}") for _, msg in e.errors]
        for run in runs:
            missing = [k + 1 for k in range(len(run.config().stages)) if run.stage_end_weights(k) is None]
            if missing:
                errors.append(("run", f"run '{run.id}' kept no weights for the end of stage "
                                      f"{', '.join(map(str, missing))} (trained before the matrix, without EWC)."))
        if errors:
            raise FormError(errors)

        def work(report, should_stop):
            out = []
            for i, run in enumerate(runs):
                def say(text, i=i, run=run):
                    report(phase=f"run {i + 1} of {len(runs)} ({run.id}): {text}")

                try:
                    out.append((run.id, stage_matrix(run, n=n, seed=seed, progress=say, should_stop=should_stop)))
                except MatrixError as e:
                    raise ValueError(str(e)) from None
            return {"runs": out}

        key = json.dumps(["matrix", [r.id for r in runs], n, seed])
        return self.evals.submit(work, label=f"stage x task matrix of {' and '.join(r.id for r in runs)}", key=key,
                                 watcher=watcher)

    # ---- the Try tab ----------------------------------------------------------------------------
    def try_models(self, mode, run_id, base, trained) -> dict:
        """{'roles': {role: model name}, 'labels', 'weights', 'system_prompt'} or FormError."""
        from grpo_app.core.config import DEFAULT_SYSTEM_PROMPT, RewardsConfig

        if mode == "run":
            run = self.run_with_model(run_id)
            cfg = run.config()
            roles = {"base": cfg.model.name, "trained": str(run.final_dir)}
            return {
                "roles": roles,
                "labels": {role: model_label(name) for role, name in roles.items()},
                "weights": dict(cfg.rewards.weights),
                "system_prompt": cfg.data.system_prompt,
                "titles": {"base": f"Base: {model_label(cfg.model.name)}", "trained": f"Trained: {run.id}"},
            }
        if mode == "models":
            errors, roles = [], {}
            for role, name in (("base", base), ("trained", trained)):
                try:
                    roles[role] = self.check_model(name)
                except FormError as e:
                    errors.append((role, f"{role} model: {e.errors[0][1]}"))
            if errors:
                raise FormError(errors)
            labels = {role: model_label(name) for role, name in roles.items()}
            return {
                "roles": roles,
                "labels": labels,
                "weights": dict(RewardsConfig().weights),
                "system_prompt": DEFAULT_SYSTEM_PROMPT,
                "titles": {"base": f"Model A: {labels['base']}", "trained": f"Model B: {labels['trained']}"},
            }
        raise FormError([("mode", f"unknown mode {mode!r}; use 'run' or 'models'.")])

    def check_try_input(self, question, gold, max_tokens) -> int:
        errors = []
        if question is not None and not isinstance(question, str):
            errors.append(("question", f"the question must be text, got {type(question).__name__}."))
        elif (msg := check_question(question)) is not None:
            errors.append(("question", msg))
        if gold is not None and not isinstance(gold, (str, int, float)):
            errors.append(("gold", "the expected answer must be a number or empty."))
        elif (msg := check_gold(None if gold is None else str(gold))) is not None:
            errors.append(("gold", msg))
        tokens = forms.parse_int(max_tokens, "max_tokens", "max answer tokens", errors, 8, self.limits.max_try_tokens)
        if errors:
            raise FormError(errors)
        return tokens

    def load_model(self, name: str):
        fp = ""
        p = Path(name)
        if p.is_dir():
            fp = ",".join(f"{f.name}:{f.stat().st_mtime_ns}" for f in sorted(p.glob("*.safetensors")))
        return self.models.get(name, fp)

    def sample_problems(self) -> list[dict]:
        """A few problems to pick from: GSM8K test (when present) and generated arithmetic."""
        if self._problems is None:
            out = []
            try:
                probs, _ = load_gsm8k("test", DataConfig())
                picks = [p for p in probs if 2 <= p.difficulty <= 3][:10]
                out += [
                    {"label": f"GSM8K: {p.question[:70]}…", "question": p.question, "answer": p.answer} for p in picks
                ]
            except DataError:
                pass
            try:
                for p in make_arithmetic(6, seed=7, min_ops=1, max_ops=2):
                    out.append({"label": f"Arithmetic: {p.question[:70]}", "question": p.question, "answer": p.answer})
            except Exception:  # noqa: BLE001 - examples are a convenience, never a reason to fail
                pass
            self._problems = out
        return self._problems

    # ---- runs -----------------------------------------------------------------------------------
    def run_summaries(self) -> list[dict]:
        out = []
        for run in self.manager.runs():
            try:
                out.append(run.summary())
            except Exception:  # noqa: BLE001 - a damaged folder must not hide the others
                log.exception("cannot read run %s", run.id)
        return out

    def run_ids(self, with_model: bool = False) -> list[str]:
        runs = self.manager.runs()
        if with_model:
            runs = [r for r in runs if r.has_final_model()]
        return [r.id for r in runs]

    def get_run(self, run_id) -> RunDir:
        if not isinstance(run_id, str) or not run_id.strip():
            raise FormError([("run", "pick a run first.")])
        try:
            return self.manager.get(run_id)
        except ValueError as e:
            raise FormError([("run", str(e))]) from None

    def run_view(self, run: RunDir) -> dict:
        cur = self.manager.current_run
        if cur is not None and cur.id == run.id:
            return live_view(self.manager)
        return disk_view(run)

    def run_evals(self, run: RunDir) -> list[tuple[str, dict]]:
        out = []
        if run.eval_dir.is_dir():
            for f in sorted(run.eval_dir.glob("*.json")):
                res = read_json(f)
                if isinstance(res, dict):
                    out.append((f.stem, res))
        return out

    def delete_run(self, run_id, confirmation) -> Result:
        try:
            run = self.get_run(run_id)
        except FormError as e:
            return Result(False, e.errors[0][1])
        if not isinstance(confirmation, str) or confirmation.strip() != run.id:
            return Result(
                False, f"To delete **{run.id}**, type its id in the confirmation box exactly; nothing was deleted."
            )
        try:
            self.manager.delete(run.id)
        except RunInProgressError as e:
            return Result(False, str(e))
        finally:
            self.views.invalidate()
        return Result(True, f"Deleted **{run.id}**.", run_id=run.id)

    # ---- lifecycle ------------------------------------------------------------------------------
    def shutdown(self, timeout: float = 600.0) -> str:
        """Stop the training job cleanly (checkpoint) and the evaluations; returns what happened."""
        msg = "no run was training"
        if self.manager.active:
            run = self.manager.current_run
            rid = run.id if run else "?"
            self.manager.stop()
            done = self.manager.wait(timeout)
            ck = run.latest_checkpoint() if (done and run is not None) else None
            if not done:
                msg = f"run {rid} did not stop within {timeout:.0f} s"
            elif ck is not None:
                msg = f"run {rid} stopped with a checkpoint (step {ck['global_step']})"
            else:
                msg = f"run {rid} stopped before its first step completed, so it has no checkpoint"
        self.evals.shutdown(wait=5.0)
        return msg


def difficulty_json(result: dict) -> str:
    return difficulty_figure(result).to_json()


def _md(text: str) -> str:
    return "".join("\\" + c if c in "\\`*_{}[]<>()#+-.!|" else c for c in str(text))
