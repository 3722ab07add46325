"""The shipped presets: every one validates, and the bigger-model preset runs on the same code path
(checked with a tiny random model of its architecture, Qwen2, since the real one cannot be downloaded here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_app.core.config import PROJECT_ROOT, load_config
from grpo_app.core.fileio import read_jsonl
from grpo_app.runs.manager import RunManager

from .conftest import make_tiny

PRESETS = sorted(p.stem for p in (PROJECT_ROOT / "configs").glob("*.yaml"))


def test_the_documented_presets_exist():
    assert {"quick", "classroom", "full", "qwen-0.5b"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_validates(name):
    cfg = load_config(name)
    assert cfg.stages and all(s.steps > 0 for s in cfg.stages)
    if len(cfg.stages) > 1:  # every curriculum demonstrates the Fisher penalty (one stage has nothing to protect)
        assert cfg.ewc.enabled
    assert cfg.model.dtype in ("auto", "float32")  # no bf16 default: it is ~28x slower on CPUs without bf16


def test_qwen_preset_trains_a_qwen2_model_through_every_stage(tmp_path, tokenizer, varied_reward):
    folder = tmp_path / "tiny-qwen2"
    model = make_tiny(tokenizer, arch="qwen2")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    cfg = load_config(
        "qwen-0.5b",
        [
            f"model.name={folder}",
            f"run.output_dir={tmp_path / 'runs'}",
            "run.save_every=0",
            "grpo.num_generations=4",
            "grpo.prompts_per_step=2",
            "grpo.micro_batch_size=0",
            "grpo.max_completion_length=32",
            "grpo.learning_rate=0.001",
            "grpo.temperature=1.0",
            "rewards.weights={correctness: 1.0, text_length: 1.0}",  # random text gets varied rewards
            "ewc.fisher_samples=4",
            *[f"stages[{i}].steps=2" for i in range(3)],
            *[f"stages[{i}].num_problems=16" for i in range(3)],
        ],
    )
    manager = RunManager(tmp_path / "runs")
    run = manager.start(cfg)
    assert manager.wait(timeout=600)
    status = run.read_status()
    assert status["status"] == "completed", status.get("error")

    metrics = read_jsonl(run.metrics_path)
    assert [m["stage"] for m in metrics] == [0, 0, 1, 1, 2, 2]
    assert any(m["ewc_penalty"] > 0 for m in metrics if m["stage"] > 0)
    events = [e["event"] for e in read_jsonl(run.events_path)]
    assert events.count("fisher_done") == 2
    saved = json.loads((Path(run.final_dir) / "config.json").read_text())
    assert saved["model_type"] == "qwen2"
