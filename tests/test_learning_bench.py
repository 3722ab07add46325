"""bench/learning.py's machinery on the tiny random model: both variants train, every set is held out and
checked, forgetting is measured from the stage-1 anchor, and the JSON, chart and README table come out."""

import json
import os
import subprocess
import sys

import pytest
import torch

from grpo_app.evaluation.stats import wilson_interval

from .conftest import ROOT, trained, varied_rule_args


def test_learning_bench_runs_the_ablation_on_a_tiny_model(tmp_path):
    out = tmp_path / "learning.json"
    cmd = [sys.executable, str(ROOT / "bench" / "learning.py"), "--config", "tests/configs/tiny.yaml", "--ablation",
           "--n", "12", "--gsm8k-n", "6", "--out", str(out), "--tag", "t1", "--eval-batch", "5", "--matrix", "4",
           "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "run.save_every=0", *varied_rule_args()]
    env = dict(os.environ, CHROMIUM="/nonexistent")  # the PNG is optional; the JSON and HTML are the record
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["models"] == ["base", "ewc", "noewc"]
    assert set(res["eval"]) == {"stage 1: s1", "stage 2: s2", "GSM8K test"}
    for name, ev in res["eval"].items():
        assert ev["overlap_with_training"] == 0 and ev["n"] > 0
        for m in res["models"]:
            k = ev[m]["correct"]
            assert ev[m]["accuracy"] == pytest.approx(k / ev["n"])  # a count of this set's problems
            assert tuple(ev[m]["ci"]) == pytest.approx(wilson_interval(k, ev["n"]))  # that count's interval
            by_d = ev[m]["by_difficulty"]  # the same answers split by difficulty: the parts add up
            assert by_d and sum(v["n"] for v in by_d.values()) == ev["n"]
            assert sum(v["correct"] for v in by_d.values()) == k
        assert {"ewc_vs_base", "ewc_vs_base_strict", "noewc_vs_base", "ewc_vs_noewc"} <= set(res["paired"][name])
    assert set(res["after_stage1"]) == {"stage 1: s1", "stage 2: s2"}  # not GSM8K: scored for stage tasks only
    assert set(res["paired"]["forgetting"]["stage 1: s1"]) == {"ewc", "noewc"}
    # the stage x task matrix of each run (issue 42): 2 stage models x 2 tasks, EWC and not
    assert set(res["matrix"]) == {"ewc", "noewc"}
    for m, mat in res["matrix"].items():
        assert len(mat["rows"]) == 2 and all(len(r) == 2 and r[0]["n"] == 4 for r in mat["rows"])
        assert mat["ewc"]["enabled"] is (m == "ewc") and "Backward transfer" in mat["summary"]
    runs = {k: v["run"] for k, v in res["runs"].items()}
    assert runs["ewc"].endswith("-learning-t1-ewc") and runs["noewc"].endswith("-learning-t1-noewc")
    ewc_cfg = (tmp_path / "runs" / os.path.basename(runs["ewc"]) / "config.yaml").read_text()
    noewc_cfg = (tmp_path / "runs" / os.path.basename(runs["noewc"]) / "config.yaml").read_text()
    assert "enabled: true" in ewc_cfg and "enabled: false" in noewc_cfg  # same config but for EWC
    assert trained(tmp_path / "runs")
    from safetensors.torch import load_file

    finals = [load_file(str(tmp_path / "runs" / os.path.basename(runs[m]) / "final" / "model.safetensors"))
              for m in ("ewc", "noewc")]
    assert any(not torch.equal(t, finals[1][n]) for n, t in finals[0].items())  # the penalty changed stage 2
    assert out.with_suffix(".html").is_file()
    assert "| held-out set (n) |" in r.stderr and "after stage 1" in r.stderr


def test_learning_bench_rejects_bad_options_before_training(tmp_path):
    for args, words in ((["--eval-batch", "0"], "batch size must be between 1 and 256"),
                        (["--tag", "a b"], "letters, digits")):
        cmd = [sys.executable, str(ROOT / "bench" / "learning.py"), "--config", "tests/configs/tiny.yaml",
               "--set", f"run.output_dir={tmp_path / 'runs'}", *args]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and words in r.stderr, r.stderr[-2000:]
        assert not (tmp_path / "runs").exists()  # nothing trained
