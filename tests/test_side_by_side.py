"""Runs side by side (issue 44, item 1): the settings in which runs differ, their curves on shared charts, a
leaderboard of their comparisons on the same problems (p against the best), scoring the missing runs for real,
the same from the CLI, and the page's refusals."""

import json
import subprocess
import sys

import pytest

from grpo_app.core.config import load_config
from grpo_app.core.fileio import atomic_write_json
from grpo_app.core.run_folder import RunDir
from grpo_app.evaluation.scoring import summarize
from grpo_app.evaluation.stats import mcnemar_exact, paired, wilson_interval
from grpo_app.runs.side_by_side import (
    SideBySideError,
    check_runs,
    common_sets,
    leaderboard,
    overlay_series,
    score_missing,
    settings_diff,
)
from grpo_app.ui.charts import overlay_figure

from .conftest import make_tiny

SET = "gsm8k-n20-seed0-d0-99"


def _records(correct: list[int]) -> list[dict]:
    return [{"id": f"q{i}", "correct": bool(c), "strict_correct": bool(c), "has_format": True, "difficulty": 2,
             "tokens": 10} for i, c in enumerate(correct)]


def save_result(run: RunDir, name: str, trained: list[int], base: list[int], problems: str = "abc") -> None:
    b, t = _records(base), _records(trained)
    atomic_write_json(run.eval_dir / f"{name}.json", {
        "origin": "GSM8K test", "key": f"m-s-p{problems}",
        "base": {"summary": summarize(b), "records": b}, "trained": {"summary": summarize(t), "records": t},
        "paired": paired(b, t),
    })


def make_runs(root, tokenizer=None, n=3, name="side") -> list[RunDir]:
    """Three finished tiny runs: EWC on / off, G 4 / 8; metrics of 4 steps over 2 stages; a model in final/
    when a tokenizer is given."""
    variants = [["ewc.enabled=true", "grpo.num_generations=4"], ["ewc.enabled=false", "grpo.num_generations=4"],
                ["ewc.enabled=true", "grpo.num_generations=8", "grpo.micro_batch_size=0"]][:n]
    runs = []
    for i, over in enumerate(variants):
        cfg = load_config("tests/configs/tiny.yaml", [f"run.output_dir={root}", f"run.name={name}{i}", *over])
        run = RunDir.create(root, cfg)
        for step in range(1, 5):
            run.append_metric({"step": step, "stage": (step - 1) // 2, "stage_name": f"s{(step - 1) // 2 + 1}",
                               "reward": 0.1 * step + i, "completion_length": 20 + step, "ewc_penalty": 0.5 * i,
                               "rss_mb": 1000 + 10 * i})
        if tokenizer is not None:
            make_tiny(tokenizer, seed=i).save_pretrained(run.final_dir)
            tokenizer.save_pretrained(run.final_dir)
        run.write_status(status="completed", started=1000.0, ended=1600.0)
        runs.append(run)
    return runs


def test_settings_diff_lists_only_the_settings_that_differ(tmp_path):
    runs = make_runs(tmp_path / "runs")
    diff = settings_diff(runs)
    assert {row["setting"] for row in diff} == {"ewc.enabled", "grpo.num_generations"}
    g = next(row for row in diff if row["setting"] == "grpo.num_generations")
    assert [g[r.id] for r in runs] == ["4", "4", "8"]
    assert settings_diff(runs[:1] * 1 + [runs[0]]) == []  # the same run twice: nothing differs


def test_leaderboard_ranks_by_accuracy_with_p_against_the_best_and_keeps_other_problems_apart(tmp_path):
    a, b, c = make_runs(tmp_path / "runs")
    d = make_runs(tmp_path / "runs", n=1, name="other")[0]
    base = [1] * 3 + [0] * 17
    save_result(a, SET, [1] * 9 + [0] * 11, base)     # 45%
    save_result(b, SET, [1] * 15 + [0] * 5, base)     # 75%: the best
    save_result(c, SET, [1] * 20, base, problems="xyz")  # other problems under the same name: not ranked
    board = leaderboard([a, b, c, d], SET)
    assert [r["run"] for r in board["rows"]] == [b.id, a.id]
    assert board["apart"] == [c.id] and board["missing"] == [d.id]
    best, second = board["rows"]
    assert best["accuracy"] == 0.75 and best["p_vs_best"] is None
    assert list(best["ci"]) == list(wilson_interval(15, 20))
    # a right on q0-q8, b on q0-q14: 6 discordant pairs, all for b
    assert second["p_vs_best"] == pytest.approx(mcnemar_exact(0, 6)) and second["paired_n"] == 20
    assert second["p_vs_base"] == pytest.approx(mcnemar_exact(0, 6))
    assert common_sets([a, b, c, d]) == [(SET, 3)]


def test_overlay_draws_one_line_per_run_with_its_stage_on_hover(tmp_path):
    runs = make_runs(tmp_path / "runs")
    series = overlay_series(runs, "reward")
    assert [s["run"] for s in series] == [r.id for r in runs]
    assert series[2]["values"] == pytest.approx([2.1, 2.2, 2.3, 2.4]) and series[0]["stages"][2] == "stage 2: s2"
    fig = overlay_figure("Reward", "reward", series)
    checked = fig.figure()  # Plotly accepts it
    assert [t.name for t in checked.data] == [r.id for r in runs]
    assert len({t.line.color for t in checked.data}) == 3
    assert "stage 2: s2" in checked.data[0].customdata and "%{customdata}" in checked.data[0].hovertemplate


def test_two_to_eight_distinct_runs(tmp_path):
    runs = make_runs(tmp_path / "runs")
    with pytest.raises(SideBySideError, match="2 to 8"):
        check_runs(runs[:1])
    with pytest.raises(SideBySideError, match="twice"):
        check_runs([runs[0], runs[0]])
    assert check_runs(runs) == runs


@pytest.mark.slow
def test_score_missing_scores_only_the_runs_without_a_result(tmp_path, tokenizer, monkeypatch):
    """Real scoring with tiny models: the run that had a result keeps it untouched, the others get theirs."""
    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(tmp_path / "cache"))
    runs = make_runs(tmp_path / "runs", tokenizer)
    name = "gsm8k-n3-seed0-d0-99"
    save_result(runs[0], name, [1, 0, 0], [0, 0, 0])
    before = (runs[0].eval_dir / f"{name}.json").read_bytes()
    said = []
    scored = score_missing(runs, 3, 0, report=lambda **f: said.append(f.get("phase", "")))
    assert scored == [runs[1].id, runs[2].id]
    assert (runs[0].eval_dir / f"{name}.json").read_bytes() == before
    board = leaderboard(runs[1:], name)
    assert len(board["rows"]) == 2 and board["missing"] == [] and all(r["n"] == 3 for r in board["rows"])
    assert any("run 1 of 2" in s for s in said) and any("run 2 of 2" in s for s in said)


def test_the_cli_prints_the_differences_and_the_leaderboard(tmp_path):
    root = tmp_path / "runs"
    a, b, c = make_runs(root)
    save_result(a, SET, [1] * 9 + [0] * 11, [0] * 20)
    save_result(b, SET, [1] * 15 + [0] * 5, [0] * 20)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "grpo_app", "runs", *args, "--runs-dir", str(root)],
                              capture_output=True, text=True, timeout=300)

    r = cli("compare", a.id, b.id, c.id)
    assert r.returncode == 0, r.stderr
    assert "ewc.enabled" in r.stdout and "grpo.num_generations" in r.stdout and "run.name" not in r.stdout
    lines = r.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("1. "))
    assert b.id in lines[first] and "75.0%" in lines[first] and "best" in lines[first]
    assert a.id in lines[first + 1] and "p vs best" in lines[first + 1]
    assert f"not scored on it: {c.id}" in r.stdout
    data = json.loads(cli("compare", a.id, b.id, "--json").stdout)
    assert [row["run"] for row in data["leaderboard"]["rows"]] == [b.id, a.id]
    bad = cli("compare", a.id)
    assert bad.returncode == 2 and "2 to 8" in bad.stderr and "Traceback" not in bad.stderr
    unknown = cli("compare", a.id, "20990101-000000-nope")
    assert unknown.returncode == 2 and "no run" in unknown.stderr and str(tmp_path) not in unknown.stderr


def test_the_page_refuses_a_bad_pick_with_a_message(tmp_path):
    from grpo_app.runs.manager import RunManager
    from grpo_app.ui.forms import FormError
    from grpo_app.ui.studio import Studio

    root = tmp_path / "runs"
    runs = make_runs(root)
    studio = Studio(manager=RunManager(root), configs_dir="tests/configs/app")
    for pick, words in (([runs[0].id], "2 to 8"), ("not a list", "pick 2 to 8"), ([runs[0].id, "../etc"], "run"),
                        ([r.id for r in runs] * 3, "2 to 8")):
        with pytest.raises(FormError) as e:
            studio.runs.side_by_side(pick)
        assert words in e.value.errors[0][1]
    res = studio.runs.side_by_side([r.id for r in runs])
    assert set(res["charts"]) == {"reward", "length", "ewc", "memory"} and len(res["diff"]) == 2
    assert json.loads(res["charts"]["reward"])["data"][0]["name"] == runs[0].id
