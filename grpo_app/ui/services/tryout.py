"""The Try tab's actions: which two models answer (a run and its base, or any two), the question checks,
the loaded models (two at most, shared by every page), sample problems."""

from __future__ import annotations

from pathlib import Path

from grpo_app.core.config import DataConfig
from grpo_app.core.custom_rewards import code_rewards_allowed, reward_functions
from grpo_app.core.data import DataError, load_gsm8k, make_arithmetic
from grpo_app.core.models import model_label
from grpo_app.evaluation.ask import check_gold, check_question
from grpo_app.ui import forms
from grpo_app.ui.forms import FormError
from grpo_app.ui.services.shared import Service


class TryService(Service):
    def __init__(self, studio):
        super().__init__(studio)
        self._problems: list[dict] | None = None

    def try_models(self, mode, run_id, base, trained) -> dict:
        """{'roles': {role: model name}, 'labels', 'weights', 'system_prompt'} or FormError."""
        from grpo_app.core.config import DEFAULT_SYSTEM_PROMPT, RewardsConfig

        if mode == "run":
            run = self.studio.run_with_model(run_id)
            cfg = run.config()
            roles = {"base": cfg.model.name, "trained": str(run.final_dir)}
            # the run's own declarative rewards score here too; its Python ones only where the server allows code
            funcs = reward_functions(cfg.rewards, python=code_rewards_allowed())
            return {
                "roles": roles,
                "labels": {role: model_label(name) for role, name in roles.items()},
                "weights": {k: w for k, w in cfg.rewards.weights.items() if k in funcs},
                "funcs": funcs,
                "system_prompt": cfg.data.system_prompt,
                "titles": {"base": f"Base: {model_label(cfg.model.name)}", "trained": f"Trained: {run.id}"},
            }
        if mode == "models":
            errors, roles = [], {}
            for role, name in (("base", base), ("trained", trained)):
                try:
                    roles[role] = self.studio.check_model(name)
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
