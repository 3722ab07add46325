"""bench/memory.py's machinery on the tiny random model: every phase of both stages is sampled."""

import json
import subprocess
import sys

from .conftest import ROOT, VARIED_RULE


def test_memory_bench_reports_each_phase_of_each_stage(tmp_path):
    import yaml

    cfg = yaml.safe_load((ROOT / "tests/configs/tiny.yaml").read_text())
    for s in VARIED_RULE:  # a reward with a signal, so forward_backward runs a real backward pass
        key, value = s.split("=", 1)
        parent = cfg["rewards"] if key.startswith("rewards.custom") else cfg["rewards"]["weights"]
        parent[key.rsplit(".", 1)[1]] = yaml.safe_load(value)
    config = tmp_path / "tiny-varied.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "memory.json"
    cmd = [sys.executable, str(ROOT / "bench" / "memory.py"), "--config", str(config),
           "--variants", "preset,no_checkpointing", "--out", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["variants"]) == {"preset", "no_checkpointing"}
    assert res["variants"]["no_checkpointing"]["overrides"] == ["grpo.gradient_checkpointing=false"]
    for v in res["variants"].values():
        phases = v["phases_peak_rss_mb"]
        for want in ("stage0/generate", "stage0/forward_backward", "stage0/optimizer", "stage0/fisher",
                     "stage1/generate", "stage1/forward_backward", "stage1/optimizer"):
            assert phases.get(want, 0) > 0, (want, phases)
        assert v["peak_rss_mb"] >= max(phases.values()) * 0.99
