"""Everything a page sends, checked before anything runs (no Gradio import).

The Train form becomes a `Config` here: the preset's YAML gives every setting the form does not
show, the form's values replace the rest, and every problem — a word where a number belongs, a
stage whose difficulty range is empty, a model path outside the folders the app may read — comes
back as (field path, message) pairs. `route_errors` sends each message to the control it is about,
so the page can show it right there and start nothing.

Model names from a page are a hub id (owner/name), 'embedded', 'tiny-random', a run id, or a folder
under the allowed roots; never '..', never a path elsewhere on the server.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_app.core.config import (
    GENERATOR_OPTIONS,
    GSM8K_MODES,
    HUB_ID_RE,
    LOSS_TYPES,
    MAX_SEED,
    MAX_STAGES,
    SCALE_REWARDS,
    SOURCES,
    SPECIAL_MODELS,
    Config,
    ConfigError,
    EWCConfig,
    GRPOSettings,
    RewardsConfig,
    StageConfig,
    _show,
    collect_errors,
    config_from_dict,
    field_bounds,
    read_yaml_file,
)
from grpo_app.core.custom_rewards import CODE_FLAG, code_rewards_allowed
from grpo_app.core.models import model_roots_text
from grpo_app.core.run_folder import RUN_ID_RE, resolve_run

STAGE_HEADERS = ["name", "source", "min difficulty", "max difficulty", "steps", "learning rate", "EWC λ", "replay"]
STAGE_REQUIRED = 5  # the last three cells may be left blank: the run's learning rate and λ, no replay
MAX_STEPS_PER_STAGE = field_bounds(StageConfig, "steps")[1]
MAX_DIFFICULTY = field_bounds(StageConfig, "max_difficulty")[1]
# (the bounds are the config fields': one limit for the YAML, the CLI and this form)
MAX_COMPLETION_TOKENS = field_bounds(GRPOSettings, "max_completion_length")[1]
MAX_PROMPTS_PER_STEP = field_bounds(GRPOSettings, "prompts_per_step")[1]
MAX_MODEL_NAME = 200
MAX_RUN_NAME = 64
STAGE_NAME_RE = re.compile(r"[^\w \-+.(),]+")  # the presets name stages with commas ("word problems, adding")


class FormError(ValueError):
    """One or more invalid form values: `errors` holds (field path, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("\n".join(f"{p}: {m}" for p, m in errors))


# ------------------------------------------------------------------------------------------------
# Scalars: parse what a browser or an API client sent, with a message that names the field.
# ------------------------------------------------------------------------------------------------
def _blank(v) -> bool:
    return v is None or (isinstance(v, str) and not v.strip()) or (isinstance(v, float) and math.isnan(v))


def parse_int(value, path: str, label: str, errors: list, lo: int | None = None, hi: int | None = None):
    """A whole number within [lo, hi], or None with a message appended to `errors`."""
    if _blank(value):
        errors.append((path, f"{label}: enter a whole number."))
        return None
    v = None
    if isinstance(value, bool):
        v = None
    elif isinstance(value, int):
        v = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        v = int(value)
    elif isinstance(value, str):
        s = value.strip()
        try:
            v = int(s)
        except ValueError:
            try:
                f = float(s)
                v = int(f) if math.isfinite(f) and f.is_integer() else None
            except ValueError:
                v = None
    if v is None:
        errors.append((path, f"{label}: expected a whole number, got {_show(value)}."))
        return None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        errors.append((path, f"{label}: {v} is out of range; use {lo} to {hi}."))
        return None
    return v


def parse_float(value, path: str, label: str, errors: list, lo: float | None = None, hi: float | None = None):
    if _blank(value):
        errors.append((path, f"{label}: enter a number."))
        return None
    v = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        v = float(value)
    elif isinstance(value, str):
        try:
            v = float(value.strip())
        except ValueError:
            v = None
    if v is None or not math.isfinite(v):
        errors.append((path, f"{label}: expected a number such as 1e-5, got {_show(value)}."))
        return None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        errors.append((path, f"{label}: {v:g} is out of range; use {lo:g} to {hi:g}."))
        return None
    return v


def parse_bool(value, path: str, label: str, errors: list):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    errors.append((path, f"{label}: expected on or off (true/false), got {_show(value)}."))
    return None


def sanitize_run_name(name) -> tuple[str, str | None]:
    """(safe name, note): letters, digits, '-' and '_' only, at most 64; a note says what changed."""
    raw = "" if name is None else str(name)
    raw = raw.strip()
    safe = re.sub(r"[^A-Za-z0-9_\-]+", "-", raw).strip("-_")[:MAX_RUN_NAME].strip("-_")
    if safe == raw:
        return safe, None
    if not safe:
        return "", f"the run name {_show(raw)} had no usable characters, so the run is named after its preset."
    return safe, f"the run name was changed to '{safe}' (only letters, digits, '-' and '_' are kept)."


# ------------------------------------------------------------------------------------------------
# Model names from a page
# ------------------------------------------------------------------------------------------------
def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def check_model_name(name, roots: list[Path], runs_root: Path | None = None) -> tuple[str | None, str | None]:
    """(the name to use, None) or (None, a message). Does not load anything.

    Accepts 'embedded', 'tiny-random', a hub id 'owner/name', a run id (its trained model), or a
    folder under `roots` holding a saved model (or a run folder, whose final/ is used).
    """
    if not isinstance(name, str):
        return None, f"the model must be text, got {_show(name)}."
    name = name.strip()
    if not name:
        return None, "no model given: use 'embedded', a hub id like 'Qwen/Qwen2.5-0.5B-Instruct', or a folder."
    if len(name) > MAX_MODEL_NAME:
        return None, f"the model name is {len(name)} characters long; a hub id or folder is at most {MAX_MODEL_NAME}."
    if any(ord(c) < 32 for c in name):
        return None, "the model name contains control characters."
    if name in SPECIAL_MODELS:
        return name, None
    if runs_root is not None and RUN_ID_RE.fullmatch(name):
        try:
            run = resolve_run(runs_root, name)  # the one rule for run ids: symlinked run folders are refused
        except ValueError:
            run = None
        if run is not None and run.has_final_model():
            return str(run.final_dir), None
        if run is not None:
            return None, f"run '{name}' has no trained model yet (a run saves one when it completes)."
    looks_like_path = name.startswith((".", "/", "~", "\\")) or "\\" in name or name.count("/") > 1
    if ".." in Path(name).parts or ".." in name.split("\\"):
        return None, f"'{name}': paths with '..' are not allowed."
    if looks_like_path or (not HUB_ID_RE.match(name) and "/" in name):
        p = Path(name).expanduser()
        if not p.is_absolute():
            return None, (
                f"'{name}' is a relative path; give a hub id (owner/name), 'embedded', a run id, or a full folder "
                f"path under {model_roots_text()}."
            )
        rp = p.resolve()
        if not _under(rp, roots):
            return (
                None,
                f"'{name}' is outside the model folders this app may read ({model_roots_text()}).",
            )
        if not rp.is_dir():
            return None, f"folder '{name}' does not exist."
        if (rp / "final" / "config.json").is_file() and not (rp / "config.json").is_file():
            rp = (rp / "final").resolve()
            if not _under(rp, roots):  # a run folder whose final/ links elsewhere
                return None, f"'{name}' is outside the model folders this app may read ({model_roots_text()})."
        if not (rp / "config.json").is_file():
            return None, f"folder '{name}' has no config.json; it does not hold a saved model."
        return str(rp), None
    if HUB_ID_RE.match(name):
        return name, None
    return None, (
        f"'{name}' is not 'embedded', a hub id (owner/name), a run id, or a model folder. Hub ids look like "
        "'HuggingFaceTB/SmolLM2-135M-Instruct'."
    )


def hub_model_problem(name: str) -> str | None:
    """For a hub id: a message when it cannot be loaded here (offline and not in the local cache)."""
    if not HUB_ID_RE.match(name or "") or Path(name).is_dir():
        return None
    from grpo_app.core.data import hub_reachable

    if hub_reachable():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return None
    except Exception:  # noqa: BLE001 - a broken cache is the same as no cache here
        pass
    return (
        f"'{name}' is not in this server's Hugging Face cache and the hub cannot be reached (offline); "
        "use 'embedded' or a model folder."
    )


# ------------------------------------------------------------------------------------------------
# Stages table
# ------------------------------------------------------------------------------------------------
def stage_rows(stages: list[StageConfig]) -> list[list]:
    """The table's rows; the per-stage settings are blank where the stage takes the run's value."""
    return [[s.name, s.source, s.min_difficulty, s.max_difficulty, s.steps,
             "" if s.learning_rate is None else f"{s.learning_rate:g}",
             "" if s.ewc_lam is None else f"{s.ewc_lam:g}",
             f"{s.replay:g}" if s.replay else ""] for s in stages]


def _rows(table) -> list[list] | None:
    """The table's rows as lists, from list-of-lists, a {headers, data} dict or a pandas DataFrame."""
    if table is None:
        return []
    if hasattr(table, "values") and hasattr(table, "columns"):  # pandas
        return [list(r) for r in table.values.tolist()]
    if isinstance(table, dict) and "data" in table:
        table = table["data"]
    if isinstance(table, (list, tuple)) and all(isinstance(r, (list, tuple)) for r in table):
        return [list(r) for r in table]
    return None


REWARD_HEADERS = ["name", "weight", "rule", "value", "must"]


def parse_custom_rewards(table, errors: list) -> tuple[list[dict], dict[str, float]] | None:
    """Declarative rewards from the page's "Rewards of your own" table: rows of [name, weight, rule, value,
    must] (value: the tolerance, the pattern, the word, or 'min-max' tokens; must: match / absent / present,
    blank = match or present). Returns (rules, weights), or None when the table is empty (the preset's own
    stay). Problems go to `errors` under rewards.custom[k]. No code runs; the rules are checked like YAML."""
    from grpo_app.core.custom_rewards import MAX_CUSTOM, check_rule

    rows = _rows(table)
    if rows is None:
        errors.append(("rewards.custom", f"the rewards table must be rows of [{', '.join(REWARD_HEADERS)}]."))
        return None
    rows = [list(r) + [None] * (len(REWARD_HEADERS) - len(r)) for r in rows if not all(_blank(c) for c in r)]
    if not rows:
        return None
    if len(rows) > MAX_CUSTOM:
        errors.append(("rewards.custom", f"{len(rows)} rewards of your own is too many; use at most {MAX_CUSTOM}."))
        return None
    rules, weights = [], {}
    for k, row in enumerate(rows):
        p = f"rewards.custom[{k}]"
        if len(row) > len(REWARD_HEADERS):
            errors.append((p, f"reward {k + 1}: a row has at most {len(REWARD_HEADERS)} cells ({', '.join(REWARD_HEADERS)})."))
            continue
        name, weight, rule, value, must = row
        name, rule = str(name or "").strip(), str(rule or "").strip()
        w = parse_float(weight, f"{p}.weight", f"reward {k + 1} weight", errors, -10.0, 10.0)
        spec: dict = {"name": name, "rule": rule}
        text = "" if _blank(value) else str(value).strip()
        if rule == "answer_within":
            tol = parse_float(text or 0, f"{p}.tolerance", f"reward {k + 1} tolerance", errors, 0.0, 1e9)
            spec["tolerance"] = 0.0 if tol is None else tol
        elif rule == "regex":
            spec["pattern"] = text
            spec["must"] = str(must or "match").strip()
        elif rule == "word":
            spec["word"] = text
            spec["must"] = str(must or "present").strip()
        elif rule == "length":
            lo, _, hi = text.partition("-")
            spec["min_tokens"] = parse_float(lo or 0, f"{p}.min_tokens", f"reward {k + 1} min tokens", errors, 0, 1e6)
            spec["max_tokens"] = parse_float(hi or 1e6, f"{p}.max_tokens", f"reward {k + 1} max tokens", errors, 0, 1e6)
        problems = check_rule(spec, p)
        errors += [(path, f"reward {k + 1} ({_show(name)}): {msg}") for path, msg in problems]
        if not problems and w is not None:
            rules.append(spec)
            weights[name] = w
    return rules, weights


def reward_rows(custom: list[dict], weights: dict) -> list[list]:
    """The table's rows for a config's declarative rewards (the inverse of parse_custom_rewards)."""
    rows = []
    for spec in custom or []:
        rule = spec.get("rule")
        value = {"answer_within": spec.get("tolerance", 0), "regex": spec.get("pattern", ""), "word": spec.get("word", ""),
                 "length": f"{spec.get('min_tokens', 0):g}-{spec.get('max_tokens', 1e6):g}"}.get(rule, "")
        rows.append([spec.get("name", ""), weights.get(spec.get("name"), 0.0), rule, value, spec.get("must", "")])
    return rows


def parse_stages(table, base: list[dict], errors: list) -> list[dict]:
    """Stage dicts from the table; each row keeps the preset stage's hidden options (problems, digits...)
    when its source is unchanged. Problems are appended to `errors` as (stages[k].field, message)."""
    rows = _rows(table)
    if rows is None:
        errors.append(("stages", f"the stages table must be rows of [{', '.join(STAGE_HEADERS)}]."))
        return []
    rows = [r for r in rows if not all(_blank(c) for c in r)]
    if not rows:
        errors.append(
            ("stages", "no stages; add at least one row (name, source, min difficulty, max difficulty, steps).")
        )
        return []
    if len(rows) > MAX_STAGES:
        errors.append(("stages", f"{len(rows)} stages is too many; use at most {MAX_STAGES}."))
        return []
    out = []
    for k, row in enumerate(rows):
        p = f"stages[{k}]"
        where = f"stage {k + 1}"
        n_cells = len(STAGE_HEADERS)
        row = list(row) + [None] * (n_cells - len(row))
        if len(row) > n_cells:
            errors.append((p, f"{where}: a row has at most {n_cells} cells ({', '.join(STAGE_HEADERS)}), got {len(row)}."))
            continue
        name, source, lo, hi, steps, lr, lam, replay = row
        own: dict = {}  # the per-stage settings (issue 42): blank = the run's value (learning rate, λ), no replay
        for key, value, label in (("learning_rate", lr, "learning rate"), ("ewc_lam", lam, "EWC λ"),
                                  ("replay", replay, "replay share")):
            if _blank(value):
                own[key] = 0.0 if key == "replay" else None
            else:
                lo_b, hi_b = field_bounds(StageConfig, key)
                own[key] = parse_float(value, f"{p}.{key}", f"{where} {label}", errors, lo_b, hi_b)
        name = STAGE_NAME_RE.sub("-", str(name or "").strip())[:40].strip() or f"stage{k + 1}"
        source = str(source or "").strip().lower()
        if source not in SOURCES:
            errors.append((f"{p}.source", f"{where}: source {_show(source)} is not one of {', '.join(SOURCES)}."))
        lo = parse_int(lo, f"{p}.min_difficulty", f"{where} min difficulty", errors, 0, MAX_DIFFICULTY)
        hi = parse_int(hi, f"{p}.max_difficulty", f"{where} max difficulty", errors, 0, MAX_DIFFICULTY)
        steps = parse_int(steps, f"{p}.steps", f"{where} steps", errors, 1, MAX_STEPS_PER_STAGE)
        if lo is not None and hi is not None and hi < lo:
            errors.append(
                (
                    f"{p}.max_difficulty",
                    f"{where}: the difficulty range {lo}..{hi} is empty (max below min); swap them.",
                )
            )
        prev = base[k] if k < len(base) and isinstance(base[k], dict) else {}
        stage = copy.deepcopy(prev) if prev.get("source") == source else {}
        if "num_problems" in prev:
            stage["num_problems"] = prev["num_problems"]
        stage.update(name=name, source=source)
        if lo is not None:
            stage["min_difficulty"] = lo
        if hi is not None:
            stage["max_difficulty"] = hi
        if steps is not None:
            stage["steps"] = steps
        stage.update({k: v for k, v in own.items() if v is not None or k != "replay"})
        out.append(stage)
    _check_repeats(out, errors)
    return out


def _check_repeats(stages: list[dict], errors: list) -> None:
    """A stage that repeats an earlier one exactly (same source, range and options) is a copy-paste slip:
    it trains on the same kind of problems again. Partly overlapping ranges are a normal curriculum."""
    keys = ("source", "min_difficulty", "max_difficulty", *GENERATOR_OPTIONS)
    for k, s in enumerate(stages):
        for j in range(k):
            if all(s.get(x) == stages[j].get(x) for x in keys):
                errors.append(
                    (
                        f"stages[{k}].min_difficulty",
                        f"stage {k + 1} repeats stage {j + 1} (same source and difficulty range "
                        f"{s.get('min_difficulty')}..{s.get('max_difficulty')}); give it another range, or delete "
                        "it and add its steps to the first one.",
                    )
                )
                break


def check_stage_pools(cfg: Config) -> list[tuple[str, str]]:
    """GSM8K stages whose difficulty range holds too few training problems (only when GSM8K is here)."""
    from grpo_app.core.data import DataError, load_gsm8k

    out = []
    probs = None
    for k, s in enumerate(cfg.stages):
        if s.source != "gsm8k":
            continue
        if probs is None:
            try:
                probs, _ = load_gsm8k("train", cfg.data)
            except DataError:
                return out  # offline: the stage will use generated stand-ins, checked when it starts
        n = sum(1 for p in probs if s.min_difficulty <= p.difficulty <= s.max_difficulty)
        if n < min(s.num_problems, 8):
            levels = sorted({p.difficulty for p in probs})
            out.append(
                (
                    f"stages[{k}].min_difficulty",
                    f"stage {k + 1}: only {n} GSM8K training problems have difficulty "
                    f"{s.min_difficulty}..{s.max_difficulty}; GSM8K difficulties run {levels[0]}..{levels[-1]} "
                    "(most are 2..4).",
                )
            )
    return out


# ------------------------------------------------------------------------------------------------
# The Train form
# ------------------------------------------------------------------------------------------------
@dataclass
class TrainForm:
    preset: Any = ""
    model: Any = "embedded"
    gsm8k: Any = "auto"
    stages: Any = None
    num_generations: Any = 8
    max_completion_length: Any = 96
    prompts_per_step: Any = 4
    learning_rate: Any = "1e-5"
    ewc: Any = True
    ewc_lam: Any = 1000.0
    lora: Any = False
    seed: Any = 42
    run_name: Any = ""
    loss_type: Any = "dapo"
    scale_rewards: Any = "group"
    custom_rewards: Any = None  # the "Rewards of your own" table (None / empty: the preset's)
    custom_path: str = ""  # a checked upload saved by the app (never a path typed by a user)
    notes: list = field(default_factory=list)


def form_values(cfg: Config) -> dict:
    """The form's values for a config (used to fill the page from a preset)."""
    return {
        "model": cfg.model.name,
        "gsm8k": cfg.data.gsm8k,
        "stages": stage_rows(cfg.stages),
        "num_generations": cfg.grpo.num_generations,
        "max_completion_length": cfg.grpo.max_completion_length,
        "prompts_per_step": cfg.grpo.prompts_per_step,
        "learning_rate": f"{cfg.grpo.learning_rate:g}",
        "ewc": cfg.ewc.enabled,
        "ewc_lam": cfg.ewc.lam,
        "loss_type": cfg.grpo.loss_type,
        "custom_rewards": reward_rows(cfg.rewards.custom, cfg.rewards.weights),
        "scale_rewards": cfg.grpo.scale_rewards,
        "lora": cfg.model.lora,
        "seed": cfg.run.seed,
        "run_name": cfg.run.name,
    }


def build_config(
    form: TrainForm, preset_data: dict, roots: list[Path], runs_root: Path | None = None, check_hub: bool = True
) -> Config:
    """The Config this form describes, validated; raises FormError with every problem found."""
    errors: list[tuple[str, str]] = []
    data = copy.deepcopy(preset_data or {})
    for sec in ("model", "data", "grpo", "ewc", "run", "rewards"):
        if not isinstance(data.get(sec), dict):
            data[sec] = {}

    model, problem = check_model_name(form.model, roots, runs_root)
    if problem:
        errors.append(("model.name", problem))
    elif check_hub:
        hub_problem = hub_model_problem(model)
        if hub_problem:
            errors.append(("model.name", hub_problem))
    if model:
        data["model"]["name"] = model

    gsm8k = str(form.gsm8k or "").strip()
    if gsm8k not in GSM8K_MODES:
        errors.append(("data.gsm8k", f"data source {_show(form.gsm8k)} is not one of {', '.join(GSM8K_MODES)}."))
    else:
        data["data"]["gsm8k"] = gsm8k
    if form.custom_path:
        data["data"]["custom_path"] = form.custom_path

    base = data.get("stages") if isinstance(data.get("stages"), list) else []
    stages = parse_stages(form.stages, base, errors)
    if stages:
        data["stages"] = stages

    g = data["grpo"]
    g_lo, g_hi = field_bounds(GRPOSettings, "num_generations")
    lr_lo, lr_hi = field_bounds(GRPOSettings, "learning_rate")
    for key, label, lo, hi in (
        ("num_generations", "G (completions per prompt)", g_lo, g_hi),
        ("max_completion_length", "completion length", *field_bounds(GRPOSettings, "max_completion_length")),
        ("prompts_per_step", "prompts per step", *field_bounds(GRPOSettings, "prompts_per_step")),
    ):
        v = parse_int(getattr(form, key), f"grpo.{key}", label, errors, lo, hi)
        if v is not None:
            g[key] = v
    lr = parse_float(form.learning_rate, "grpo.learning_rate", "learning rate", errors)
    if lr is not None and not lr_lo < lr <= lr_hi:
        errors.append(
            (
                "grpo.learning_rate",
                f"learning rate: {lr:g} must be above {lr_lo:g} and at most {lr_hi:g} (typical: 1e-6 to 5e-5).",
            )
        )
    elif lr is not None:
        g["learning_rate"] = lr
    for key, label, options in (("loss_type", "loss type", LOSS_TYPES), ("scale_rewards", "advantage scaling",
                                                                        SCALE_REWARDS)):
        value = getattr(form, key)
        if value in (None, ""):
            continue  # the preset's
        if not isinstance(value, str) or value not in options:
            errors.append((f"grpo.{key}", f"{label}: {_show(value)} is not one of {', '.join(options)}."))
        else:
            g[key] = value

    own = parse_custom_rewards(form.custom_rewards, errors)
    if own is not None:
        rules, weights = own
        old_names = {s.get("name") for s in data.get("rewards", {}).get("custom") or [] if isinstance(s, dict)}
        data.setdefault("rewards", {})
        data["rewards"]["custom"] = rules
        base = data["rewards"].get("weights")
        base = dict(RewardsConfig().weights) if base is None else base  # (a preset without rewards: the defaults)
        kept = {k: v for k, v in base.items() if k not in old_names}
        data["rewards"]["weights"] = {**kept, **weights}

    ewc_on = parse_bool(form.ewc, "ewc.enabled", "EWC", errors)
    if ewc_on is not None:
        data["ewc"]["enabled"] = ewc_on
    lam = parse_float(form.ewc_lam, "ewc.lam", "EWC λ", errors, *field_bounds(EWCConfig, "lam"))
    if lam is not None:
        data["ewc"].pop("lambda", None)
        data["ewc"]["lam"] = lam
    lora = parse_bool(form.lora, "model.lora", "LoRA", errors)
    if lora is not None:
        data["model"]["lora"] = lora
    seed = parse_int(form.seed, "run.seed", "seed", errors, 0, MAX_SEED)
    if seed is not None:
        data["run"]["seed"] = seed
    name, note = sanitize_run_name(form.run_name)
    if note:
        form.notes.append(note)
    data["run"]["name"] = name

    try:
        cfg = config_from_dict(data)
    except ConfigError as e:
        raise FormError(errors + e.errors) from None
    if cfg.rewards.functions and not code_rewards_allowed():  # refused before any of it is imported
        names = ", ".join(str(p)[:60] for p in cfg.rewards.functions[:4])
        raise FormError(errors + [("rewards.functions", (
            f"this preset runs Python reward functions ({names}); a shared server does not run its users' code. "
            f"Start the server with {CODE_FLAG}=1 to allow it (only for code you trust), or train it from the "
            "command line."))])
    note = cfg.grpo.fit_micro_batch()  # the preset's chunking may have been sized for another G
    if note:
        form.notes.append(note)
    seen = {p for p, _ in errors}
    more = [
        (p, m) for p, m in collect_errors(cfg) if p not in seen and not (p == "model.name" and "model.name" in seen)
    ]
    errors += more
    if not errors:
        errors += check_stage_pools(cfg)
    if errors:
        raise FormError(errors)
    return cfg


def load_preset_data(path: Path) -> dict:
    data = read_yaml_file(Path(path), Path(path).name)
    if not isinstance(data, dict):
        raise ConfigError([("preset", f"{Path(path).name} does not hold a mapping of settings.")])
    if not data.get("preset"):
        data["preset"] = Path(path).stem
    return data


# ------------------------------------------------------------------------------------------------
# Where each message is shown
# ------------------------------------------------------------------------------------------------
SLOTS = (
    "preset",
    "model",
    "data",
    "upload",
    "stages",
    "num_generations",
    "prompts_per_step",
    "max_completion_length",
    "learning_rate",
    "ewc",
    "lora",
    "seed",
    "run_name",
    "loss",
    "rewards",
)
_ROUTES = (
    ("model.lora", "lora"),
    ("model.", "model"),
    ("data.custom_path", "upload"),
    ("data.", "data"),
    ("upload", "upload"),
    ("stages", "stages"),
    ("grpo.num_generations", "num_generations"),
    ("grpo.prompts_per_step", "prompts_per_step"),
    ("grpo.micro_batch_size", "num_generations"),
    ("grpo.max_completion_length", "max_completion_length"),
    ("grpo.learning_rate", "learning_rate"),
    ("grpo.loss_type", "loss"),
    ("rewards.", "rewards"),
    ("grpo.scale_rewards", "loss"),
    ("ewc.", "ewc"),
    ("run.seed", "seed"),
    ("run.name", "run_name"),
    ("preset", "preset"),
    ("config", "preset"),
)


def route_errors(errors: list[tuple[str, str]]) -> dict[str, list[str]]:
    """{slot: [messages]} for the controls of the Train tab; anything else goes to 'general'."""
    out: dict[str, list[str]] = {}
    for path, msg in errors:
        slot = next((s for prefix, s in _ROUTES if path == prefix.rstrip(".") or path.startswith(prefix)), "general")
        out.setdefault(slot, []).append(msg if slot != "general" else f"{path}: {msg}")
    return out


def errors_md(errors: list[tuple[str, str]]) -> str:
    lines = "\n".join(f"- **{_field_label(p)}**: {m}" for p, m in errors)
    return f"**Nothing was started — fix {'this setting' if len(errors) == 1 else 'these settings'}:**\n{lines}"


_LABELS = {
    "model.name": "Model",
    "data.gsm8k": "Data source",
    "data.custom_path": "Uploaded dataset",
    "upload": "Uploaded dataset",
    "grpo.num_generations": "G",
    "grpo.max_completion_length": "Completion length",
    "grpo.prompts_per_step": "Prompts per step",
    "grpo.learning_rate": "Learning rate",
    "grpo.loss_type": "Loss type",
    "grpo.scale_rewards": "Advantage scaling",
    "ewc.lam": "EWC λ",
    "ewc.enabled": "EWC",
    "model.lora": "LoRA",
    "run.seed": "Seed",
    "run.name": "Run name",
}


def _field_label(path: str) -> str:
    if path in _LABELS:
        return _LABELS[path]
    m = re.match(r"stages\[(\d+)\]", path)
    if m:
        return f"Stage {int(m.group(1)) + 1}"
    return path
