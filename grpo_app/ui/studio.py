"""The state every page shares, and one service per tab (no Gradio import).

One `Studio` per server holds the `RunManager` (the one training job), the evaluation queue, the
models loaded for the Try tab, and small caches that keep the page cheap for a room full of
watchers: the current run view is computed at most every `view_ttl` seconds for everybody; each
chart, the status answer, the status line and the run log are built once per change of the run
(`monitor` version markers) and handed to every page ready-made (only the elapsed time moves with
the clock). Each tab calls its own service (`studio.train`, `studio.compare`, `studio.tryout`,
`studio.runs`, in `ui/services/`); the Gradio tabs only translate components to those calls.
"""

from __future__ import annotations

import os
from pathlib import Path

from grpo_app.core.config import CONFIG_DIR
from grpo_app.core.models import allowed_model_roots
from grpo_app.core.run_folder import RunDir
from grpo_app.evaluation.ask import ModelCache
from grpo_app.runs.job_queue import JobQueue
from grpo_app.runs.manager import RunManager
from grpo_app.ui import forms
from grpo_app.ui.forms import FormError
from grpo_app.ui.services.compare import CompareService, difficulty_json  # noqa: F401 (the tabs' import)
from grpo_app.ui.services.runs import RunsService
from grpo_app.ui.services.shared import (  # noqa: F401 (the tabs' and tests' import)
    MEMORY_BUILD_S,
    TRAIN_CHARTS,
    FigureCache,
    Limits,
    Result,
    ViewCache,
)
from grpo_app.ui.services.train import TrainService
from grpo_app.ui.services.tryout import TryService


class Studio:
    """The shell every page shares: the state (one per server) and one service per tab, `train`, `compare`,
    `tryout` and `runs`. What several tabs need (model names, a run with a trained model, the current
    view, shutting down) is here."""

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
        self.train = TrainService(self)
        self.compare = CompareService(self)
        self.tryout = TryService(self)
        self.runs = RunsService(self)

    # ---- what several tabs share ----------------------------------------------------------------
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

    def view(self) -> dict:
        return self.views.get()

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
