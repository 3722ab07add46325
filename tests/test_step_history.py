"""Answers across training (steps.jsonl, its bound, its readers, the `answers` command) and the what-if
recompute of a GRPO group's advantages, checked against a trained step and against TRL's own code."""

import json
import os
import subprocess
import sys

import pytest
import torch

from grpo_app.core.config import load_config
from grpo_app.core.run_folder import RunDir
from grpo_app.runs.manager import RunManager
from grpo_app.runs.step_history import as_step, correct_count, find_problem, problem_history, problems, step_at
from grpo_app.training.advantages import group_advantages, what_if

from .conftest import ROOT


def _tiny_run(runs_dir, *extra):
    cfg = load_config(
        "tests/configs/tiny.yaml",
        [
            f"run.output_dir={runs_dir}",
            "rewards.weights={correctness: 1.0, text_length: 0.5, has_number: 0.25}",
            # two problems per stage and two prompts per step: each problem is sampled at every step of its stage
            "stages[0].num_problems=2",
            "stages[1].num_problems=2",
            *extra,
        ],
    )
    mgr = RunManager(runs_dir)
    run = mgr.start(cfg)
    assert mgr.wait(300)
    assert run.read_status()["status"] == "completed", run.read_status()
    return run


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """One tiny two-stage run (2 + 2 steps, 2 prompts x G=4) shared by the tests below."""
    from grpo_app.core.rewards import REWARD_FUNCS

    from .conftest import text_length

    runs = tmp_path_factory.mktemp("runs")
    REWARD_FUNCS["text_length"] = text_length  # (module scope: monkeypatch is per test)
    try:
        yield _tiny_run(runs)
    finally:
        REWARD_FUNCS.pop("text_length", None)


def test_every_step_is_recorded_with_its_groups(trained_run):
    run = trained_run
    steps = run.steps()
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert [s["stage"] for s in steps] == [0, 0, 1, 1]
    for s in steps:
        assert len(s["groups"]) == 2 and s["scale_rewards"] == "group"
        assert s["weights"] == {"correctness": 1.0, "text_length": 0.5, "has_number": 0.25}
        for g in s["groups"]:
            assert len(g["completions"]) == len(g["advantages"]) == len(g["totals"]) == 4
            assert set(g["rewards"]) == {"correctness", "text_length", "has_number"}
            assert g["problem_id"].startswith("arith-")
            assert isinstance(g["difficulty"], int) and g["difficulty"] >= 1  # the column rewards received
    # the latest step of the history is the one latest_step.json shows
    latest = json.loads(run.step_path.read_text())
    assert steps[-1]["groups"][0]["completions"] == latest["groups"][0]["completions"]
    assert steps[-1]["groups"][1]["advantages"] == latest["groups"][1]["advantages"]


def test_one_problem_across_steps(trained_run):
    steps = trained_run.steps()
    ps = problems(steps)
    assert len(ps) == 4  # two problems per stage
    assert all(len(p["steps"]) == 2 for p in ps)
    first_stage = [p for p in ps if p["steps"] == [1, 2]]
    assert len(first_stage) == 2
    p = first_stage[0]
    hist = problem_history(steps, p["key"])
    assert [h["step"] for h in hist] == [1, 2]
    for h in hist:
        assert h["group"]["question"] == p["question"] and len(h["group"]["completions"]) == 4
        assert as_step(h)["groups"] == [h["group"]]
    # the two samplings of the same problem are different draws
    assert hist[0]["group"]["completions"] != hist[1]["group"]["completions"]
    assert find_problem(steps, p["key"]) == p and find_problem(steps, "1") == ps[0]
    assert find_problem(steps, "no-such-id") is None and find_problem(steps, "99") is None
    assert step_at(steps, 3)["step"] == 3 and step_at(steps, 9) is None
    assert correct_count(hist[0]["group"]) == sum(hist[0]["group"]["rewards"]["correctness"])


def test_what_if_with_the_runs_weights_reproduces_the_recorded_advantages(trained_run):
    nonzero = 0
    for s in trained_run.steps():
        for g in s["groups"]:
            res = what_if(g, s["weights"], scale_rewards=s["scale_rewards"])
            assert res["advantages"] == pytest.approx(g["advantages"], abs=1e-6)
            assert res["totals"] == pytest.approx(g["totals"], abs=1e-6)
            assert res["mean"] == pytest.approx(g["mean"], abs=1e-6)
            assert res["std"] == pytest.approx(g["std"], abs=1e-5)
            nonzero += any(abs(a) > 1e-3 for a in g["advantages"])
    assert nonzero  # text_length gives a random model's groups spread, so this compared real advantages


def test_cli_answers_lists_follows_a_problem_and_shows_a_step(trained_run):
    env = dict(os.environ, GRPO_APP_RUNS_DIR=str(trained_run.path.parent))

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "grpo_app", "answers", *args], cwd=ROOT, capture_output=True, text=True, env=env
        )

    steps = trained_run.steps()
    p = problems(steps)[0]
    listing = cli(trained_run.id)
    assert listing.returncode == 0, listing.stderr
    assert "4 steps recorded" in listing.stdout and p["key"] in listing.stdout
    one = cli(trained_run.id, "--problem", p["key"])
    assert one.returncode == 0, one.stderr
    assert one.stdout.count("mean total") == len(p["steps"])
    first = problem_history(steps, p["key"])[0]["group"]
    assert f"adv {first['advantages'][0]:+.2f}" in one.stdout
    at = cli(trained_run.id, "--problem", p["key"], "--step", str(p["steps"][-1]))
    assert at.returncode == 0 and at.stdout.count("mean total") == 1
    step = cli(trained_run.id, "--step", "3")
    assert step.returncode == 0 and step.stdout.count("mean total") == 2
    for bad in (["--problem", "nope"], ["--step", "99"]):
        r = cli(trained_run.id, *bad)
        assert r.returncode == 2 and r.stderr and "Traceback" not in r.stderr
    # what-if from the command line: the run's own weights give the recorded advantages again
    same = cli(trained_run.id, "--step", "3", "--what-if", "correctness=1,text_length=0.5,has_number=0.25")
    assert same.returncode == 0, same.stderr
    rec = step_at(steps, 3)
    for g in rec["groups"]:
        for a in g["advantages"]:
            assert f"adv {a:+.2f}  what-if total" in same.stdout
    first_two = cli(trained_run.id, "--step", "3", "--group-size", "2")
    assert first_two.returncode == 0 and first_two.stdout.count("(left out)") == 4  # 2 of 4 left out, 2 groups
    for bad in (["--step", "3", "--what-if", "nope=1"], ["--what-if", "correctness=1"], ["--step", "3", "--group-size", "9"]):
        r = cli(trained_run.id, *bad)
        assert "Traceback" not in r.stderr
        assert r.returncode == 2 or "cannot recompute" in r.stdout
    missing = cli("no-such-run")
    assert missing.returncode == 2 and "no run" in missing.stderr and "Traceback" not in missing.stderr


# ------------------------------------------------------------------------------------------------
# The bound on steps.jsonl (synthetic snapshots: no training needed)
# ------------------------------------------------------------------------------------------------
def _snapshot(step: int, text: str = "x" * 200, groups: int = 2, g: int = 4) -> dict:
    return {
        "step": step,
        "stage": 0,
        "stage_name": "s",
        "stage_step": step,
        "weights": {"correctness": 1.0},
        "scale_rewards": "group",
        "groups": [
            {
                "problem_id": f"p-{k}",
                "question": f"q{k}",
                "answer": "1",
                "system": "a long system prompt " * 20,
                "completions": [f"{step}:{text}"] * g,
                "rewards": {"correctness": [1.0, 0.0, 0.0, 0.0][:g]},
                "totals": [1.0, 0.0, 0.0, 0.0][:g],
                "mean": 0.25,
                "std": 0.5,
                "advantages": [1.5, -0.5, -0.5, -0.5][:g],
            }
            for k in range(groups)
        ],
    }


def test_steps_file_stays_under_its_bound_and_keeps_first_and_latest(tmp_path):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    cap = 40_000
    for step in range(1, 121):
        run.append_step(_snapshot(step), max_bytes=cap)
        assert run.steps_path.stat().st_size <= cap
    kept = [s["step"] for s in run.steps()]
    assert kept[0] == 1 and kept[-1] == 120  # the first and the latest step survive every thinning
    assert kept == sorted(set(kept)) and len(kept) < 120  # thinned, in order, no duplicates
    newest = kept[len(kept) // 2 :]
    assert newest == list(range(newest[0], 121))  # the newer half is whole
    rec = run.steps()[-1]
    assert "system" not in rec["groups"][0] and rec["groups"][0]["completions"][0].startswith("120:")


def test_long_completions_are_cut_and_counted(tmp_path):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.append_step(_snapshot(1, text="y" * 5000), max_chars=100)
    rec = run.steps()[0]
    assert rec["clipped"] == 8
    assert all(len(c) == 101 and c.endswith("…") for g in rec["groups"] for c in g["completions"])


def test_a_redone_step_replaces_the_earlier_line_and_torn_lines_are_skipped(tmp_path):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.append_step(_snapshot(1))
    run.append_step(_snapshot(2, text="before resume"))
    with open(run.steps_path, "a") as fh:
        fh.write('{"step": 3, "groups": [')  # a crash mid-write
    run.append_step(_snapshot(2, text="after resume"))
    steps = run.steps()
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[1]["groups"][0]["completions"][0] == "2:after resume"


# ------------------------------------------------------------------------------------------------
# what_if: hand-computed cases and TRL's own functions
# ------------------------------------------------------------------------------------------------
GROUP = {
    "question": "What is 2 + 2?",
    "answer": "4",
    "completions": ["2 + 2 = 4\n#### 4", "#### 5", "I think it is 4", "#### 4"],
    "rewards": {"correctness": [1.0, 0.0, 0.0, 1.0], "has_number": [1.0, 1.0, 1.0, 1.0]},
}


def test_what_if_hand_computed():
    # totals with correctness 1, has_number 0.5: 1.5 0.5 0.5 1.5; mean 1.0; sample std sqrt(4 * 0.25 / 3)
    r = what_if(GROUP, {"correctness": 1.0, "has_number": 0.5})
    std = (1.0 / 3) ** 0.5
    assert r["totals"] == [1.5, 0.5, 0.5, 1.5]
    assert r["mean"] == pytest.approx(1.0) and r["std"] == pytest.approx(std, rel=1e-6)
    a = 0.5 / (std + 1e-4)
    assert r["advantages"] == pytest.approx([a, -a, -a, a], rel=1e-6)
    # without scaling the advantage is just total - mean
    assert what_if(GROUP, {"correctness": 1.0}, scale_rewards="none")["advantages"] == pytest.approx([0.5, -0.5, -0.5, 0.5])
    # paying only for a number: every total is 1, so every advantage is 0 (no learning signal)
    flat = what_if(GROUP, {"correctness": 0.0, "has_number": 1.0})
    assert flat["advantages"] == [0.0] * 4 and flat["std"] == 0.0 and flat["weights"] == {"has_number": 1.0}
    # the first two completions only: totals 1, 0 -> mean 0.5, std sqrt(0.5)
    two = what_if(GROUP, {"correctness": 1.0}, group_size=2)
    assert two["completions"] == GROUP["completions"][:2]
    assert two["advantages"] == pytest.approx([0.5 / (0.5**0.5 + 1e-4), -0.5 / (0.5**0.5 + 1e-4)], rel=1e-6)
    # a reward the run did not record is scored now from the text (strict_format: last line '#### n')
    fmt = what_if(GROUP, {"strict_format": 1.0})
    assert fmt["computed"] == ["strict_format"] and fmt["rewards"]["strict_format"] == [1.0, 1.0, 0.0, 1.0]
    # ... with the columns the step passed: 'arithmetic' checks the work against the group's question
    work = dict(GROUP, completions=["2 + 2 = 4\n#### 4", "3 + 3 = 6\n#### 6", "2 + 2 = 5", "#### 4"], difficulty=1)
    assert what_if(work, {"arithmetic": 1.0})["rewards"]["arithmetic"] == [1.0, 0.0, 0.0, 0.0]
    for bad in (0, 5):
        with pytest.raises(ValueError, match="group size"):
            what_if(GROUP, {"correctness": 1.0}, group_size=bad)


def test_group_advantages_match_trl_on_random_rewards():
    from trl.trainer.utils import nanstd

    gen = torch.Generator().manual_seed(0)
    rpf = torch.rand(6 * 8, 3, generator=gen).round(decimals=2)  # 6 groups of 8, three reward functions
    w = torch.tensor([1.0, 0.3, 0.7])
    names = ["a", "b", "c"]
    table = {n: [rpf[g * 8 : (g + 1) * 8, i].tolist() for g in range(6)] for i, n in enumerate(names)}
    weights = dict(zip(names, w.tolist()))
    rewards = (rpf * w.unsqueeze(0)).nansum(dim=1)  # TRL's lines, sum_then_normalize
    mean = torch.nanmean(rewards.view(-1, 8), dim=1).repeat_interleave(8, dim=0)
    std_g = nanstd(rewards.view(-1, 8), dim=1).repeat_interleave(8, dim=0)
    std_b = nanstd(rewards).expand_as(rewards)
    for scale, expect in (
        ("group", (rewards - mean) / (std_g + 1e-4)),
        ("batch", (rewards - mean) / (std_b + 1e-4)),
        ("none", rewards - mean),
    ):
        got = group_advantages(table, weights, scale)["advantages"]
        assert torch.equal(torch.tensor(got).flatten(), expect), scale  # bit-identical
    # what_if with batch scaling uses every group of the step
    groups = [{"completions": ["x"] * 8, "rewards": {n: table[n][g] for n in names}} for g in range(6)]
    r = what_if(groups[2], weights, scale_rewards="batch", batch_groups=groups)
    assert torch.equal(torch.tensor(r["advantages"]), ((rewards - mean) / (std_b + 1e-4))[16:24])


def test_group_advantages_give_exactly_zero_to_a_group_of_equal_totals_as_the_trainer_does():
    """Departure 4: eight all-right answers under the classroom weights total 1.9 each; TRL's float32 mean and std
    leave them +0.0012 each, the trainer (and so the what-if) gives 0. A group that differs keeps TRL's numbers."""
    from trl.trainer.utils import nanstd

    weights = {"correctness": 1.0, "lenient_correctness": 0.5, "strict_format": 0.3, "soft_format": 0.1}
    ones, mixed = [1.0] * 8, [1.0, 0.0] * 4
    table = {n: [ones, mixed if n == "correctness" else ones] for n in weights}
    totals = torch.tensor([1.9] * 8, dtype=torch.float32)
    residue = (totals - totals.mean()) / (nanstd(totals) + 1e-4)
    assert (residue != 0).all()  # TRL's arithmetic: not 0 (so this test can fail)
    res = group_advantages(table, weights)
    assert res["advantages"][0] == [0.0] * 8
    assert min(abs(a) for a in res["advantages"][1]) > 0.5
    assert what_if({"completions": ["x"] * 8, "rewards": {n: ones for n in weights}}, weights)["advantages"] == [0.0] * 8


def test_forced_hint_spans_and_the_loss_mode_are_kept_in_the_record(tmp_path):
    """Departure 8: the record keeps where the trainer wrote the hint (Answers across training and the CLI mark
    it from there), cut with its text; groups without a hint carry no spans."""
    from grpo_app.runs.step_history import forced_span

    snap = _snapshot(1, text="y" * 300)
    snap["forced_loss"] = "train"
    snap["groups"][0]["forced"] = [None, [10, 16], [98, 104], [150, 156]]
    snap["groups"][1]["forced"] = [None] * 4
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.append_step(snap, max_chars=100)
    rec = run.steps()[0]
    assert rec["forced_loss"] == "train"
    g0, g1 = rec["groups"]
    assert [forced_span(g0, i) for i in range(4)] == [None, (10, 16), (98, 100), None]  # the last was cut away
    assert "forced" not in g1
