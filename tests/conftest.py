"""Shared fixtures. Fast tests use a tiny random model built here (no download); GSM8K comes from
../shared/data/gsm8k (never copied into the repo); the hub is never contacted."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Overrides that give tests/configs/tiny.yaml's groups a signal: its random model rarely writes a digit, so
# `has_number` can pay 0 to every completion and no weight would move. Random text starts with a space about
# half the time. For runs in a subprocess, where the `varied_reward` fixture does not reach.
VARIED_RULE = ["rewards.custom=[{name: space_first, rule: regex, pattern: '^ '}]", "rewards.weights.space_first=1.0"]


def varied_rule_args() -> list[str]:
    """VARIED_RULE as a bench's `--set` arguments."""
    return [a for s in VARIED_RULE for a in ("--set", s)]


def trained(runs_root: Path) -> bool:
    """Whether any run under runs_root took a step with a non-zero gradient (its weights moved)."""
    import json

    return any(json.loads(line).get("grad_norm") for m in runs_root.glob("*/metrics.jsonl") for line in m.open())
SHARED_GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The step-time limit (estimate.check_step) divides by this machine's measured matmul rate, which a machine
# shared with other test runs measures far below its idle figure; tests/test_estimate.py tests it explicitly.
os.environ.setdefault("GRPO_APP_MAX_STEP_MINUTES", "0")
if SHARED_GSM8K.is_dir():
    os.environ.setdefault("GRPO_APP_GSM8K_DIR", str(SHARED_GSM8K))


@pytest.fixture(scope="session")
def tokenizer():
    from grpo_app.core.models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("tiny-random"))


def make_tiny(tokenizer, arch: str = "llama", seed: int = 0, layers: int | None = None):
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_app.core.models import tiny_config

    torch.manual_seed(seed)
    cfg = tiny_config(len(tokenizer), arch)
    if layers:
        cfg.num_hidden_layers = layers
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


@pytest.fixture
def tiny_model(tokenizer):
    return make_tiny(tokenizer)


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    d = tmp_path / "runs"
    monkeypatch.setenv("GRPO_APP_RUNS_DIR", str(d))
    return d


def text_length(prompts, completions, **kw):
    """Test reward: a random model's completions differ in length, so groups get advantages."""
    from grpo_app.core.rewards import completion_text

    return [len(completion_text(c)) / 100 for c in completions]


@pytest.fixture
def varied_reward(monkeypatch):
    """Registers the `text_length` reward (use it in rewards.weights) for runs in this process."""
    from grpo_app.core.rewards import REWARD_FUNCS

    monkeypatch.setitem(REWARD_FUNCS, "text_length", text_length)


def checkpoint_files(folder: Path) -> Path:
    """The files that make a checkpoint folder loadable by `runs.checkpoint_problem`'s checks (tiny weights, a
    trainer state, an optimizer state) for tests that build checkpoint folders by hand."""
    import json

    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.zeros(64)}, str(folder / "model.safetensors"))
    torch.save({"state": {}}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 0}))
    return folder


def wait_until(pred, timeout=120, every=0.1):
    """Poll `pred` every `every` seconds until it is true (True) or `timeout` seconds pass (False)."""
    t = time.time()
    while time.time() - t < timeout:
        if pred():
            return True
        time.sleep(every)
    return False
