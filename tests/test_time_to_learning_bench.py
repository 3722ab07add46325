"""bench/time_to_learning.py on the tiny random model: snapshots at wall-clock marks and at the end, each
scored on held-out stage problems paired with the base, with the clock and the goal check in the JSON."""

import json
import os
import subprocess
import sys

from .conftest import ROOT, trained, varied_rule_args

BENCH = [sys.executable, str(ROOT / "bench" / "time_to_learning.py")]


def _bench(tmp_path, *args: str) -> dict:
    """Runs the bench on the tiny preset (runs under tmp_path, no checkpoints) and returns its JSON."""
    out = tmp_path / "ttl.json"
    cmd = [*BENCH, "--config", "tests/configs/tiny.yaml", *args, "--out", str(out),
           "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "run.save_every=0", *varied_rule_args()]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    assert trained(tmp_path / "runs")  # the snapshots are of a model that moved, not copies of the base
    return json.loads(out.read_text())


def test_time_to_learning_bench_scores_snapshots_against_the_base(tmp_path):
    res = _bench(tmp_path, "--every", "0.001", "--n", "6", "--eval-batch", "6")
    pts = res["points"]
    # a mark that every step passes: one snapshot per optimizer step (2 + 2), then the final model
    assert [p["step"] for p in pts] == [1, 2, 3, 4, 4] and [p["final"] for p in pts] == [False] * 4 + [True]
    times = [p["train_seconds"] for p in pts]
    assert times == sorted(times) and times[-1] <= res["run_wall_seconds_incl_load"]
    assert set(res["sets"]) == {"stage 1: s1", "stage 2: s2"}
    assert all(s["overlap_with_training"] == 0 and s["n"] == 6 for s in res["sets"].values())
    for p in pts:
        for name, v in p["sets"].items():
            assert v["gain"] == round(v["accuracy"] - res["base"][name]["accuracy"], 4)
            assert 0 <= v["p_value"] <= 1
        assert p["goal_met"] is False  # a tiny random model does not learn arithmetic in 4 steps
    assert res["first_point_meeting_goal_s"] is None and res["peak_rss_mb"] > 0


def test_time_to_learning_bench_trains_only_the_first_stages_asked_for(tmp_path):
    res = _bench(tmp_path, "--stages", "1", "--every", "1000", "--n", "4", "--eval-batch", "4")
    assert [p["step"] for p in res["points"]] == [2] and res["points"][0]["final"]  # stage s1's 2 steps only
    assert set(res["sets"]) == {"stage 1: s1"} and res["stages"] == ["s1"]


def test_time_to_learning_bench_snapshots_at_the_steps_asked_for(tmp_path):
    res = _bench(tmp_path, "--at-steps", "2,3", "--every", "100000", "--n", "4", "--eval-batch", "4")
    # no wall-clock mark is reached: the end of stage s1 (step 2), step 3, then the final model
    assert [(p["step"], p["at_step"], p["final"]) for p in res["points"]] == [
        (2, True, False), (3, True, False), (4, False, True)]
    assert res["at_steps"] == [2, 3] and "--at-steps 2,3" in res["command"]
    bad = subprocess.run([*BENCH, "--at-steps", "two"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--at-steps takes step numbers" in bad.stderr and "Traceback" not in bad.stderr


def test_time_to_learning_bench_scores_with_the_training_hint_when_asked(tmp_path):
    res = _bench(tmp_path, "--stages", "1", "--every", "1000", "--n", "4", "--eval-batch", "4", "--with-hint",
                 "--set", 'data.training_hint="\\nEnd with #### <number>."')
    (pt,) = res["points"]
    assert set(pt["with_hint"]) == set(pt["sets"]) == set(res["base_with_hint"]) == {"stage 1: s1"}
    v = pt["with_hint"]["stage 1: s1"]
    assert v["gain"] == round(v["accuracy"] - res["base_with_hint"]["stage 1: s1"]["accuracy"], 4)
    plain = _bench(tmp_path / "plain", "--stages", "1", "--every", "1000", "--n", "4", "--eval-batch", "4", "--with-hint")
    assert "with_hint" not in plain["points"][0] and plain["base_with_hint"] == {}  # no hint: nothing to ask with


def test_hinted_sets_ask_the_same_problems_with_the_hint():
    from bench.time_to_learning import hinted_sets
    from grpo_app.evaluation.scoring import EvalSettings

    plain = EvalSettings(n=3)
    sets = {"stage 1: s1": (["p1", "p2"], plain, "origin", 0)}
    (probs, s, origin, k), = hinted_sets(sets, "\nHint.").values()
    assert (probs, origin, k) == (["p1", "p2"], "origin", 0) and s.after_question == "\nHint." and s.n == 3
    assert plain.after_question == "" and hinted_sets(sets, "") == {}  # the plain sets stay plain
