"""bench/ceiling.py (the base model's pass@k and the share of GRPO groups that carry a signal) and
bench/int8_sampler.py (int8 sampler speed and mismatch) compute what they claim: the signal share against
brute-force enumeration, the summary against hand-made records, and both benches end to end on the tiny
random model."""

import itertools
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.ceiling import signal_share, summarize

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("k, c, g", [(8, 0, 4), (8, 1, 4), (8, 3, 2), (8, 8, 8), (6, 2, 6), (5, 4, 3)])
def test_signal_share_is_the_chance_that_a_group_is_mixed(k, c, g):
    answers = [1] * c + [0] * (k - c)
    groups = list(itertools.combinations(range(k), g))
    mixed = sum(0 < sum(answers[i] for i in grp) < g for grp in groups)
    assert signal_share(c, k, g) == pytest.approx(mixed / len(groups))
    with pytest.raises(ValueError):
        signal_share(c, k, k + 1)


def test_summary_of_hand_made_records():
    recs = [{"correct": c, "strict_correct": min(c, 1)} for c in (0, 0, 1, 4, 8)]
    s = summarize(recs, k=8, seed=0)
    assert s["n"] == 5 and s["any_correct"] == 0.6 and s["all_correct"] == 0.2
    assert s["pass"]["pass"][0] == pytest.approx((0 + 0 + 1 / 8 + 4 / 8 + 1) / 5)  # pass@1 = mean success rate
    assert s["pass"]["pass"][-1] == pytest.approx(3 / 5)  # pass@8 with 8 samples = any correct
    assert s["success_counts"] == {"0": 2, "1": 1, "2": 0, "3": 0, "4": 1, "5": 0, "6": 0, "7": 0, "8": 1}
    assert s["signal_share_by_G"]["8"] == pytest.approx(2 / 5)  # only c = 1 and c = 4 give a mixed group of 8


def _bench(script: str, *args: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    p = subprocess.run(
        [sys.executable, f"bench/{script}", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout[p.stdout.index("{") :])


def test_ceiling_bench_on_the_tiny_model(tmp_path):
    out = tmp_path / "c.json"
    r = _bench(
        "ceiling.py", "--model", "tiny-random", "--n", "3", "--k", "4", "--max-new-tokens", "8", "--out", str(out)
    )
    assert json.loads(out.read_text()) == r
    assert r["sample"]["n"] == 3 and len(r["records"]) == 3 and all(x["n"] == 4 for x in r["records"])
    assert sum(v["n"] for v in r["by_difficulty"].values()) == 3
    assert r["all"]["pass"]["k"] == [1, 2, 3, 4]


def test_ceiling_bench_pairs_with_an_earlier_result(tmp_path):
    """--pair-with: the other result's pass@k on the shared problems and McNemar on 'solved in k', matched by
    id (a problem the other result lacks is left out); a result measured differently is refused up front."""
    r1 = _bench("ceiling.py", "--model", "tiny-random", "--n", "3", "--k", "4", "--max-new-tokens", "8")
    other = dict(r1, model="hand-made")
    ids = [r["id"] for r in r1["records"]]
    other["records"] = [{"id": ids[0], "n": 4, "correct": 4, "strict_correct": 4},  # solved every time
                        {"id": ids[1], "n": 4, "correct": 0, "strict_correct": 0}]  # ids[2] missing
    hand = tmp_path / "hand.json"
    hand.write_text(json.dumps(other))
    r2 = _bench("ceiling.py", "--model", "tiny-random", "--n", "3", "--k", "4", "--max-new-tokens", "8",
                "--pair-with", str(hand))
    pr, mine = r2["paired"], {r["id"]: r["correct"] for r in r2["records"]}
    assert pr["n"] == 2 and pr["other_model"] == "hand-made"
    assert pr["other_pass"]["pass"] == pytest.approx([0.5] * 4)  # one problem always right, one never
    assert pr["this_pass"]["pass"][-1] == pytest.approx(sum(mine[i] > 0 for i in ids[:2]) / 2)
    s = pr["solved_in_k"]
    assert (s["only_base"], s["only_trained"]) == (int(mine[ids[0]] == 0), int(mine[ids[1]] > 0))
    p = subprocess.run(
        [sys.executable, "bench/ceiling.py", "--model", "tiny-random", "--n", "3", "--k", "2", "--pair-with", str(hand)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2 and "measured differently (k 4 there, 2 here" in p.stderr, p.stderr[-2000:]


def test_int8_sampler_bench_on_the_tiny_model(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "\n".join(
            json.dumps(m)
            for m in (
                {"gen_seconds": 10.0, "step_seconds": 10.0},  # sampling only (nothing trained): left out
                {"gen_seconds": 3.0, "step_seconds": 10.0},
                {"gen_seconds": 3.0, "step_seconds": 10.0},
            )
        )
    )
    r = _bench(
        "int8_sampler.py",
        "--model",
        "tiny-random",
        "--batch",
        "8",
        "--g",
        "4",
        "--tokens",
        "8",
        "--repeats",
        "1",
        "--metrics",
        str(metrics),
    )
    assert r["speed"]["fp32"]["seconds"] > 0 and r["speed"]["int8"]["seconds"] > 0
    m = r["mismatch"]
    assert m["tokens"] > 0 and m["ratio_p01_p50_p99"][0] <= m["ratio_p01_p50_p99"][2] <= m["ratio_max"]
    assert r["classroom_step"]["steps"] == 2 and r["classroom_step"]["sampling_share"] == 0.3
    s = r["sampler_speedup"]
    assert r["classroom_step"]["step_speedup_bound"] == pytest.approx(1 / (0.7 + 0.3 / s), abs=2e-3)


def test_request_cost_bench_times_each_page_event(tmp_path):
    """bench/request_cost.py: each live-view request a page sends, answered without error after a finished run;
    the draw carries the charts and the step (much more than a poll's status line and markers); and one Gradio
    event for scale."""
    out = tmp_path / "r.json"
    r = _bench("request_cost.py", "--n", "25", "--out", str(out))
    assert json.loads(out.read_text()) == r
    assert r["run_steps"] == 30 and set(r["events"]) == {"poll", "draw", "memory", "gradio_status"}
    ev = r["events"]
    assert all(0 < e["median_ms"] <= e["p90_ms"] for e in ev.values())
    assert ev["draw"]["answer_bytes"] > 10 * ev["poll"]["answer_bytes"]


def test_watchers_slowdown_is_taken_against_the_baselines_around_each_page_phase():
    from bench.watchers import mean_ci95, summary, with_slowdowns

    def phase(pages, step_s, ms_per_token, rnd=0):
        return {"pages": pages, "round": rnd, "step_s_median": step_s, "step_s": [step_s], "ms_per_token": ms_per_token,
                "answers": 10 * pages, "errors": 0, "p95_s": 0.1, "cpu": None}

    # the host slows from 10 to 14 s a step; each page phase is compared with the mean of its two neighbours
    phases = with_slowdowns([phase(0, 10, 100), phase(30, 13.2, 132), phase(0, 12, 120), phase(30, 13, 130, 1),
                             phase(0, 14, 140)])
    assert [p.get("baseline_s") for p in phases] == [None, 11, None, 13, None]
    assert [p.get("training_slowdown") for p in phases] == [None, 0.2, None, 0.0, None]
    assert [p.get("training_slowdown_per_token") for p in phases] == [None, 0.2, None, 0.0, None]
    s = summary(phases, [30])["30"]
    assert s["training_slowdown_per_round"] == [0.2, 0.0] and s["training_slowdown_mean"] == 0.1
    assert s["training_slowdown_per_token_median"] == 0.1 and s["answers"] == 600
    # Student-t interval of a mean, by hand: mean 0.05, sd 0.0913, t(3) = 3.182 -> 0.05 +- 0.1452
    assert mean_ci95([0.1, 0.0, -0.05, 0.15]) == [-0.095, 0.195]
    assert mean_ci95([0.1]) is None
    # many rounds: the t quantile tends to 2 (2.042 from 30 degrees of freedom on)
    xs = [0.01 * (i % 5) for i in range(40)]
    lo, hi = mean_ci95(xs)
    assert hi - lo == pytest.approx(2 * 2.042 * statistics.stdev(xs) / math.sqrt(40), abs=2e-3)


def _simulated_watch(slowdown: float, seed: int, rounds: int = 30):
    """Phases as bench/watchers.py runs them (a 20-s baseline, then a page phase of 20-33 s, ...) and the
    steps of a training whose speed drifts by +-30% over ~7 minutes and slows by `slowdown` for the share of
    a step spent under the pages."""
    import random

    rng = random.Random(seed)
    phases, t = [], 1000.0
    for r in range(rounds):
        phases.append({"pages": 0, "t0": t, "t1": t + 20})
        t += 20
        d = 20 + rng.uniform(0, 13)
        phases.append({"pages": 30, "round": r, "t0": t, "t1": t + d})
        t += d
    phases.append({"pages": 0, "t0": t, "t1": t + 20})
    pages = [(p["t0"], p["t1"]) for p in phases if p["pages"]]
    spans, t = [], 990.0
    while t < phases[-1]["t1"]:
        tokens = rng.uniform(900, 1100)
        d0 = tokens * 0.01 * (1 + 0.3 * math.sin(2 * math.pi * t / 400)) * math.exp(rng.gauss(0, 0.05))
        f = sum(max(0.0, min(t + d0, b) - max(t, a)) for a, b in pages) / d0
        d = d0 * (1 + slowdown * f)
        spans.append((t, t + d, tokens))
        t += d
    return spans, phases


@pytest.mark.parametrize("true", [0.0, 0.1, 0.25])
def test_watchers_lockin_finds_a_known_slowdown_under_drift(true):
    from bench.watchers import lockin_slowdown

    for seed in range(3):
        spans, phases = _simulated_watch(true, seed)
        r = lockin_slowdown(spans, phases, 30)
        assert r["cycles"] >= 30 and r["steps"] > 100
        assert r["slowdown"] == pytest.approx(true, abs=0.03)
        lo, hi = r["ci95"]
        assert lo < r["slowdown"] < hi and hi - lo < 0.15
    assert lockin_slowdown(spans, phases, 100) is None  # no 100-page phase


def test_format_rate_counts_hand_made_answers():
    from bench.format_rate import rates

    texts = ["4 + 3 = 7\n#### 7", "#### 8 is my answer", "7", "#### 9"]
    r = rates(texts, ["7", "8", "7", "7"], group=2)
    assert (r["answers"], r["soft_format"], r["strict_format"]) == (4, 0.75, 0.5)
    assert (r["correct_strict"], r["correct_flexible"]) == (0.5, 0.75)  # '#### 9' is wrong; '7' needs the fallback
    assert r["p_step_has_answer_line"] == 0.75 and r["p_step_has_marker"] == round(1 - 0.25**2, 4)


def test_format_rate_bench_on_the_tiny_model(tmp_path):
    out = tmp_path / "f.json"
    r = _bench("format_rate.py", "--config", "tests/configs/tiny.yaml", "--n", "3", "--k", "2", "--variant", "preset",
               "--variant", "hint", "--set", 'data.training_hint="\\nHint."', "--out", str(out))
    assert json.loads(out.read_text()) == r and set(r["variants"]) == {"preset", "hint"}
    assert r["variants"]["preset"]["after_question"] == "\nHint."  # the preset's own hint
    assert "'#### <number>'" in r["variants"]["hint"]["after_question"]
    assert all(v["answers"] == 6 and 0 <= v["soft_format"] <= 1 for v in r["variants"].values())
    assert r["samples_per_step"] == 8  # the tiny preset's G = 4 x 2 prompts


def test_bucket_lengths_bench_rebuilds_the_training_pass_micro_batches():
    """bench/bucket_lengths.py replays a step as the training pass gets it: micro-batches of the given size in
    order, zero-advantage rows out, completions right-padded to the step's longest (TRL's padding), prompts
    left-padded, and the dapo normalizer counting the whole step's completion tokens."""
    from bench.bucket_lengths import micro_batches, parse_setting

    rows = [([1, 2], [5, 6, 7], 0.5), ([1, 2, 3], [5], 0.0), ([4], [5, 6, 7, 8, 9], -0.5), ([4], [5, 6], 0.0)]
    mbs = micro_batches(rows, 2, pad=0)
    assert len(mbs) == 2 and [mb["advantages"].tolist() for mb in mbs] == [[0.5], [-0.5]]
    assert mbs[0]["completion_ids"].tolist() == [[5, 6, 7, 0, 0]]  # padded to the step's longest (5)
    assert mbs[0]["completion_mask"].tolist() == [[1, 1, 1, 0, 0]]
    assert mbs[1]["prompt_ids"].tolist() == [[0, 0, 4]] and mbs[1]["prompt_mask"].tolist() == [[0, 0, 1]]
    assert all(mb["num_items_in_batch"].item() == 3 + 1 + 5 + 2 for mb in mbs)
    assert len(micro_batches(rows[1:2] + rows[3:], 2, pad=0)) == 0  # nothing to train on: no micro-batch
    assert parse_setting("off", 8) == (False, 0, 8, True, True) and parse_setting("64@32", 8) == (True, 64, 32, True, True)
    assert parse_setting("64/whole", 8) == (True, 64, 8, False, True)
    assert parse_setting("off@16/whole", 8) == (False, 0, 16, False, True)
    assert parse_setting("64/keep", 8) == (True, 64, 8, True, False)  # no layer recompute


def test_bucket_lengths_bench_zeroes_the_advantages_of_equal_groups_unless_asked_for_the_recorded_ones(tmp_path):
    """A run recorded before 2026-12-02 holds TRL's residue (-3e-4) for a group of equal totals: the replay gives
    it 0, as the trainer now does (departure 4), and '/trl0' keeps the recorded values."""
    from bench.bucket_lengths import step_rows

    class Tok:
        eos_token_id = 0

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [len(text)]}

        def apply_chat_template(self, msgs, **kw):
            return [1, 2]

    flat = {"question": "q1", "completions": ["a", "bb"], "totals": [0.4, 0.4], "advantages": [-3e-4, -3e-4]}
    mixed = {"question": "q2", "completions": ["a", "bb"], "totals": [1.9, 0.4], "advantages": [0.7, -0.7]}
    f = tmp_path / "steps.jsonl"
    f.write_text(json.dumps({"groups": [flat, mixed]}) + "\n")
    now = step_rows(f, Tok(), "sys", 1)[0]
    then = step_rows(f, Tok(), "sys", 1, recorded=True)[0]
    assert [r[2] for r in now] == [0.0, 0.0, 0.7, -0.7]
    assert [r[2] for r in then] == [-3e-4, -3e-4, 0.7, -0.7]


def _gsm8k_rows(n: int) -> list[str]:
    return [json.dumps({"question": f"Tom has {i} apples and buys 2 more. How many now?",
                        "answer": f"{i} + 2 = <<{i}+2={i + 2}>>{i + 2}\n#### {i + 2}"}) for i in range(n)]


def test_gsm8k_solvable_keeps_the_mixed_problems_and_writes_only_their_rows(tmp_path):
    from bench.gsm8k_solvable import teachable, write_gsm8k_folder

    recs = [{"id": f"gsm8k-train-{i}", "correct": c} for i, c in enumerate((0, 1, 16, 7, 0, 15))]
    assert [r["id"] for r in teachable(recs, 16)] == ["gsm8k-train-1", "gsm8k-train-3", "gsm8k-train-5"]
    src = tmp_path / "src"
    src.mkdir()
    rows = _gsm8k_rows(6)
    (src / "train.jsonl").write_text("\n".join(rows[:3]) + "\n\n" + "\n".join(rows[3:]))  # a blank line is skipped
    (src / "test.jsonl").write_text("test rows\n")
    dst = tmp_path / "dst"
    assert write_gsm8k_folder(dst, src, {"gsm8k-train-1", "gsm8k-train-5"}) == 2
    assert (dst / "train.jsonl").read_text().splitlines() == [rows[1], rows[5]]  # row numbers as the loader counts them
    assert (dst / "test.jsonl").read_text() == "test rows\n"


def test_gsm8k_solvable_bench_trains_and_pairs_on_the_tiny_model(tmp_path):
    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "train.jsonl").write_text("\n".join(_gsm8k_rows(12)) + "\n")
    (data / "test.jsonl").write_text("\n".join(_gsm8k_rows(20)[12:]) + "\n")
    out = tmp_path / "s.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRPO_APP_GSM8K_DIR=str(data), GRPO_APP_RUNS_DIR=str(tmp_path / "runs"))
    p = subprocess.run(
        [sys.executable, "bench/gsm8k_solvable.py", "--model", "tiny-random", "--no-filter", "--pool", "6", "--k", "2",
         "--max-new-tokens", "8", "--group", "2", "--prompts", "2", "--micro-batch", "4", "--steps", "2",
         "--test-k", "2", "--batch", "8", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["ceiling"]["problems"] == 6 and len(r["ceiling"]["records"]) == 6
    assert r["train"]["status"] == "completed" and r["train"]["steps"] == 2 and r["train"]["teachable_rows"] == 6
    assert "side" not in r["train"]  # on a CPU the base is scored after the training, not beside it
    assert r["train"]["weights"].endswith("final") and str(tmp_path / "runs") in r["train"]["run"]
    assert r["train"]["grpo"]["num_generations"] == 2 and r["train"]["grpo"]["prompts_per_step"] == 2
    t = r["test"]
    assert t["n"] == 8 and t["base"]["n"] == 8 and t["trained"]["n"] == 8
    pf = t["paired"]["flexible"]
    assert pf["n"] == 8 and pf["only_base"] + pf["only_trained"] + pf["both"] + pf["neither"] == 8
    assert set(r["test_pass_k"]) == {"trained", "base"} and len(r["test_pass_k"]["base"]["correct"]) == 8
    # a screen's variant: the same training again from that ceiling (no sampling), another training seed,
    # scored on the dev set only: the test split is not read
    p = subprocess.run(
        [sys.executable, "bench/gsm8k_solvable.py", "--model", "tiny-random", "--no-filter", "--ceiling-from", str(out),
         "--max-new-tokens", "8", "--group", "2", "--prompts", "2", "--micro-batch", "4", "--steps", "1",
         "--seed", "1", "--dev-n", "4", "--skip-test", "--batch", "8", "--out", str(tmp_path / "again.json")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["ceiling"]["from"] == str(out) and again["ceiling"]["records"] == r["ceiling"]["records"]
    assert again["train"]["teachable_rows"] == 6 and again["train"]["steps"] == 1 and again["args"]["seed"] == 1
    assert "test" not in again and "test_pass_k" not in again and again["dev"]["n"] == 4
    assert set(again["dev"]["right"]["trained"]) <= set(again["dev"]["ids"])
    # score-only: the first run's trained model on the dev set (train rows outside the 6-problem pool), no test
    runs_before = sorted(d.name for d in (tmp_path / "runs").iterdir())
    p = subprocess.run(
        [sys.executable, "bench/gsm8k_solvable.py", "--model", "tiny-random", "--ceiling-from", str(out),
         "--weights", r["train"]["weights"], "--dev-n", "4", "--skip-test", "--max-new-tokens", "8", "--batch", "8",
         "--out", str(tmp_path / "dev.json")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    dev = json.loads((tmp_path / "dev.json").read_text())
    assert "test" not in dev and "run" not in dev["train"] and dev["train"]["weights"] == r["train"]["weights"]
    assert dev["dev"]["n"] == 4 and dev["dev"]["base"]["n"] == 4 and dev["dev"]["paired"]["flexible"]["n"] == 4
    assert dev["dev"]["base"]["cut_at_budget"] > 0.5  # a random tiny model runs to its 8-token budget
    assert dev["dev"]["ids"] == again["dev"]["ids"]  # the dev draw does not follow --seed: variants share it
    assert dev["dev"]["right"]["base"] == again["dev"]["right"]["base"]  # the same base, greedy, same problems
    assert sorted(d.name for d in (tmp_path / "runs").iterdir()) == runs_before  # nothing trained


def test_gsm8k_solvable_dev_set_is_train_outside_the_pool_and_fixed_by_the_seed():
    from types import SimpleNamespace

    from bench.gsm8k_solvable import dev_problems

    train = [SimpleNamespace(id=f"gsm8k-train-{i}") for i in range(50)]
    used = {f"gsm8k-train-{i}" for i in range(0, 50, 2)}
    dev = dev_problems(train, used, 10, seed=0)
    assert len(dev) == 10 and len({p.id for p in dev}) == 10 and not {p.id for p in dev} & used
    assert [p.id for p in dev] == [p.id for p in dev_problems(train, used, 10, seed=0)]
    assert [p.id for p in dev] != [p.id for p in dev_problems(train, used, 10, seed=1)]
    assert len(dev_problems(train, used, 999, seed=0)) == 25  # no more than are left


def test_gsm8k_solvable_reuses_a_saved_ceiling_and_refuses_a_foreign_one(tmp_path):
    from bench.gsm8k_solvable import reused_ceiling

    saved = tmp_path / "run.json"
    recs = [{"id": "gsm8k-train-0", "correct": 1}, {"id": "gsm8k-train-2", "correct": 0}]
    saved.write_text(json.dumps({"ceiling": {"k": 4, "records": recs}}))
    c = reused_ceiling(saved, {"gsm8k-train-0", "gsm8k-train-1", "gsm8k-train-2"})
    assert c["records"] == recs and c["k"] == 4 and c["teachable"] == 1 and c["from"] == str(saved)
    with pytest.raises(SystemExit, match="1 problems are not in this GSM8K train split"):
        reused_ceiling(saved, {"gsm8k-train-0"})
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a JSON written by this bench"):
        reused_ceiling(tmp_path / "other.json", set())


@pytest.mark.parametrize("args, says", [
    (["--micro-batch", "0"], "--micro-batch"),
    (["--group", "1"], "--group must be at least 2"),
    (["--ceiling-from", "no/such.json"], "no such file"),
    (["--weights", "no/such/folder", "--ceiling-from", "assets/gsm8k_solvable_gpu.json"], "no trained weights there"),
    (["--skip-test"], "--skip-test needs --dev-n"),
    (["--skip-test", "--dev-n", "5", "--test-k", "4"], "drop one of them"),
])
def test_gsm8k_solvable_refuses_bad_arguments_with_a_message(args, says):
    p = subprocess.run([sys.executable, "bench/gsm8k_solvable.py", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr


def test_the_gsm8k_preset_trains_what_the_measured_cpu_run_trained():
    """configs/gsm8k.yaml is the run in assets/gsm8k_solvable_cpu_p16.json (the bench's stage config with that
    JSON's arguments) except where the 122 problems come from (a list instead of a filtered folder), the run's
    name and its checkpoints. A change to either side that changes the training fails here."""
    import argparse
    import dataclasses

    from bench.gsm8k_solvable import stage_config
    from grpo_app.core.config import load_config

    rec = json.loads((ROOT / "assets" / "gsm8k_solvable_cpu_p16.json").read_text())
    measured = stage_config(argparse.Namespace(**rec["args"]), Path(os.environ["GRPO_APP_GSM8K_DIR"]),
                            rec["train"]["teachable_rows"])
    preset = load_config("gsm8k")
    sides = []
    for cfg in (measured, preset):
        d = dataclasses.asdict(cfg)
        for key in ("preset", "description"):
            d.pop(key)
        for key in ("name", "save_every"):
            d["run"].pop(key)
        for key in ("gsm8k", "gsm8k_dir"):
            d["data"].pop(key)
        d["stages"][0].pop("problem_ids")
        assert d["model"].pop("dtype") in ("float32", "auto")  # auto is float32 on a CPU, where it was measured
        d["ewc"] = {"enabled": d["ewc"]["enabled"]} if not d["ewc"]["enabled"] else d["ewc"]  # off: its settings are unused
        sides.append(d)
    assert sides[0] == sides[1]
    assert rec["train"]["steps"] == preset.stages[0].steps == 18


def test_stability_noise_is_the_exact_chance_of_a_read_loss_under_no_change():
    """bench/stability_noise.py: with D discordant problems each flipping either way at 1/2, a loss of more than
    3 points on 100 problems needs (before-only minus after-only) >= 4."""
    from bench.stability_noise import analyse, p_fail_if_kept

    assert p_fail_if_kept(1, 1, 100, 3) == 0.0  # two flips can read at most -2 points
    assert p_fail_if_kept(2, 2, 100, 3) == 1 / 16  # all four against
    assert p_fail_if_kept(3, 3, 100, 3) == 7 / 64  # six: 6-0 or 5-1 against
    assert p_fail_if_kept(3, 3, 150, 3) == 1 / 64  # on 150 problems only 6-0 reads a loss over 3 points
    assert p_fail_if_kept(3, 3, 200, 3) == 0.0  # on 200 even 6-0 reads 3 points, not more
    cell = {"n": 100, "accuracy": 0.5}
    matrix = {"run_id": "r", "tasks": [{"name": "a"}, {"name": "b"}],
              "rows": [[cell, cell], [{**cell, "vs_before": {"only_before": 2, "only_after": 2}}, cell],
                       [{**cell, "vs_before": {"only_before": 5, "only_after": 1}},
                        {**cell, "vs_before": {"only_before": 3, "only_after": 3}}]]}
    res = analyse(matrix, 3)
    assert [(c["after_stage"], c["task"], c["change_points"], c["discordant"]) for c in res["cells"]] == \
        [(2, 1, 0.0, 4), (3, 1, -4.0, 6), (3, 2, 0.0, 6)]
    assert res["p_all_pass_if_kept"] == round((1 - 1 / 16) * (1 - 7 / 64) ** 2, 4)


def test_packed_sampling_bench_on_the_tiny_model(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps({"gen_seconds": g, "step_seconds": 10.0}) for g in (3.0, 5.0)))
    r = _bench("packed_sampling.py", "--model", "tiny-random", "--rounds", "1", "--metrics", str(metrics))
    assert r["packed_layers"] > 0 and r["pack_seconds"] >= 0
    t, g = r["training"], r["greedy"]
    assert t["rows"] == 32 and g["rows"] == 32 and t["temperature"] == 0.8 and g["temperature"] == 0.0
    assert t["tokens_identical"] is True and g["answers_identical"] is True  # the same model, packed or not
    assert t["generated_tokens"]["plain"] == t["generated_tokens"]["packed"] > 0
    assert t["packed_over_plain"] > 0 and len(t["seconds"]["plain"]) == len(t["seconds"]["packed"]) == 1
    w = r["whole_step"]
    assert w["steps"] == 2 and w["sampling_share"] == 0.4
    assert w["step_time_ratio"] == pytest.approx(0.6 + 0.4 * t["packed_over_plain"], abs=2e-3)


def test_answer_breakdown_splits_the_right_answers_at_the_tasks_most_common_answer():
    from bench.curriculum_screen import answer_breakdown

    def rec(gold, pred):
        return {"gold": gold, "pred": pred, "correct": gold == pred}

    # 3 of 6 problems have the answer 1; the model writes 1 four times (two right), and gets 1 of the 3 others
    records = [rec("1", "1"), rec("1", "1"), rec("1", "4"), rec("5", "1"), rec("7", "7"), rec("12", "1")]
    b = answer_breakdown(records)
    assert b == {"answer": "1", "share": 0.5, "right_modal": 2, "n_modal": 3, "right_other": 1, "n_other": 3,
                 "wrote_modal": 4}
    # a tie goes to the smaller answer, whatever the order; no records, no breakdown
    assert answer_breakdown([rec("10", "10"), rec("9", "3")])["answer"] == "9"
    assert answer_breakdown([]) == {}
