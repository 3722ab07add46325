"""The real embedded SmolLM2-135M with very few steps: the engine's 'done when', end to end."""

import json
import os
import subprocess
import sys

import pytest
import torch

from .conftest import ROOT

pytestmark = pytest.mark.slow


def cli(*args, env):
    return subprocess.run([sys.executable, "-m", "grpo_app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=1500, env=env)


def test_quick_preset_two_stages_on_embedded_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from grpo_app.core.models import embedded_model_dir

    env = dict(os.environ, GRPO_APP_RUNS_DIR=str(tmp_path))
    r = cli("train", "--config", "quick", "--set", "stages[0].steps=2", "--set", "stages[1].steps=3",
            "--set", "rewards.weights={correctness: 1.0, strict_format: 0.2, soft_format: 0.1, brevity: 0.2}",
            "--set", "ewc.fisher_samples=8", env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = next(p for p in tmp_path.iterdir() if p.is_dir())
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["stage"] for m in metrics] == [0, 0, 1, 1, 1]
    assert max(m["ewc_penalty"] for m in metrics if m["stage"] == 1) > 0
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert "fisher_done" in events and events[-1] == "finished"
    stage2 = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()
              if '"stage_start"' in line][1]
    assert stage2["source"] == "gsm8k" and "GSM8K train" in stage2["origin"]

    trained = AutoModelForCausalLM.from_pretrained(run / "final", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32)
    bp = dict(base.named_parameters())
    diffs = [(p - bp[n]).abs().max().item() for n, p in trained.named_parameters()]
    assert max(diffs) > 0

    e = cli("eval", "--model", str(run / "final"), "--n", "8", "--max-new-tokens", "96", env=env)
    assert e.returncode == 0, e.stderr[-2000:]
    assert "accuracy" in e.stdout and "[" in e.stdout and "Wilson" in e.stdout
