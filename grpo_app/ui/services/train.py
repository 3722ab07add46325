"""The Train tab's actions: presets, uploads, start / stop / resume, and the live status, run log and charts
(each built once per change of the run for every page watching)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from grpo_app.core.config import ConfigError
from grpo_app.core.data import DataError, parse_custom_dataset
from grpo_app.runs.manager import RunInProgressError
from grpo_app.runs.monitor import job_start, progress, resume_target
from grpo_app.ui import forms, render
from grpo_app.ui.charts import memory_figure, training_figures
from grpo_app.ui.forms import FormError, TrainForm
from grpo_app.ui.services.shared import MEMORY_BUILD_S, TRAIN_CHARTS, Result, Service, _md


class TrainService(Service):
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

    def start(self, form: TrainForm, upload=None) -> Result:
        try:
            data = self.preset_data(form.preset)
            if upload:
                form.custom_path, _ = self.check_upload(upload)
            cfg = forms.build_config(form, data, self.studio.model_roots(), self.manager.root)
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

    def status(self, view: dict | None = None) -> dict:
        """JSON-ready status of the run the Train tab shows. Computed once per version of the run for every
        page (`answers`); only a running job's elapsed time is brought up to the clock per request."""
        view = view or self.studio.view()
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
