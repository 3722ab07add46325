"""The Runs tab's actions: the list of runs, one run's view and saved evaluations, deleting a run, and several
runs side by side (overlaid curves, the settings that differ, a leaderboard; issue 44)."""

from __future__ import annotations

import json
import logging

from grpo_app.core.fileio import read_json
from grpo_app.core.run_folder import RunDir
from grpo_app.runs.manager import RunInProgressError
from grpo_app.runs.monitor import disk_view, live_view
from grpo_app.runs.side_by_side import (
    MAX_RUNS,
    OVERLAY_METRICS,
    SideBySideError,
    check_runs,
    common_sets,
    gsm8k_set,
    leaderboard,
    overlay_series,
    score_missing,
    settings_diff,
)
from grpo_app.ui import forms
from grpo_app.ui.charts import overlay_figure
from grpo_app.ui.forms import FormError
from grpo_app.ui.services.shared import Result, Service

log = logging.getLogger("grpo_app.ui")


class RunsService(Service):
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

    # ---- several runs side by side (issue 44) -----------------------------------------------------------
    def pick_runs(self, run_ids) -> list[RunDir]:
        """The picked runs (2 to MAX_RUNS, each once), or FormError('side_runs', ...) saying what to pick."""
        if not isinstance(run_ids, (list, tuple)) or not all(isinstance(r, str) for r in run_ids):
            raise FormError([("side_runs", f"pick 2 to {MAX_RUNS} runs from the list.")])
        if len(run_ids) > MAX_RUNS:  # (before reading any folder)
            raise FormError([("side_runs", f"pick 2 to {MAX_RUNS} runs to put side by side ({len(run_ids)} picked).")])
        runs = [self.get_run(r) for r in run_ids]
        try:
            return check_runs(runs)
        except SideBySideError as e:
            raise FormError([("side_runs", str(e))]) from None

    def side_by_side(self, run_ids, set_name: str | None = None) -> dict:
        """Charts (Plotly JSON per OVERLAY_METRICS name), the settings that differ, the problem sets scored and
        the leaderboard on `set_name` (default: the set most of the runs share, else GSM8K n=100 seed 0)."""
        runs = self.pick_runs(run_ids)
        charts = {}
        for name, (_, title, ytitle) in OVERLAY_METRICS.items():
            charts[name] = overlay_figure(title, ytitle, overlay_series(runs, name)).to_json()
        sets = common_sets(runs)
        names = [s for s, _ in sets]
        if not isinstance(set_name, str) or set_name not in names:
            set_name = names[0] if names else gsm8k_set(100, 0)
        return {"runs": [r.id for r in runs], "charts": charts, "diff": settings_diff(runs), "sets": sets,
                "board": leaderboard(runs, set_name)}

    def submit_score_missing(self, run_ids, n, seed, watcher: str | None = None):
        """Queue the scoring on GSM8K test (n problems, seed) of the picked runs that lack it; returns the Job."""
        errors: list = []
        n = forms.parse_int(n, "side_n", "N (problems)", errors, 1, self.limits.max_eval_n)
        seed = forms.parse_int(seed, "side_n", "seed", errors, 0, forms.MAX_SEED)
        try:
            runs = self.pick_runs(run_ids)
        except FormError as e:
            errors += e.errors
        if errors:
            raise FormError(errors)

        def work(report, should_stop):
            return {"scored": score_missing(runs, n, seed, report, should_stop), "set": gsm8k_set(n, seed)}

        key = json.dumps(["score-missing", sorted(r.id for r in runs), n, seed])
        return self.evals.submit(work, label=f"score {len(runs)} runs on GSM8K (n={n})", key=key, watcher=watcher)
