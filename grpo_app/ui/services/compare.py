"""The Compare tab's actions: a comparison of two models (or a run and its base) queued on the evaluation
queue, and the stage x task matrix of a run, beside another."""

from __future__ import annotations

import json

from grpo_app.ui import forms
from grpo_app.ui.charts import difficulty_figure
from grpo_app.ui.forms import FormError
from grpo_app.ui.services.shared import Service


class CompareService(Service):
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
                run = self.studio.run_with_model(run_id)
            except FormError as e:
                errors += e.errors
        elif mode == "models":
            if eval_set != "gsm8k":
                errors.append(("eval_set", "held-out stage problems need a run: pick 'A run vs its base model'."))
            for role, name in (("base", base), ("trained", trained)):
                try:
                    names[role] = self.studio.check_model(name)
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
                runs.append(self.studio.run_with_model(rid))
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


def difficulty_json(result: dict) -> str:
    return difficulty_figure(result).to_json()
