"""The Runs tab's actions: the list of runs, one run's view and saved evaluations, deleting a run."""

from __future__ import annotations

import logging

from grpo_app.core.fileio import read_json
from grpo_app.core.run_folder import RunDir
from grpo_app.runs.manager import RunInProgressError
from grpo_app.runs.monitor import disk_view, live_view
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
