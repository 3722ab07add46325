"""The stage x task matrix (issue 42): the weights each stage ended with are kept, and the matrix scores them."""

import pytest
import torch
from safetensors.torch import load_file

from grpo_app.core.config import load_config
from grpo_app.evaluation.stage_matrix import MatrixError, stage_matrix, summary_sentence
from grpo_app.runs.manager import RunManager

from .conftest import VARIED_RULE, wait_until


def _train(root, ewc: bool):
    cfg = load_config("tests/configs/tiny.yaml", [
        f"ewc.enabled={str(ewc).lower()}", "run.eval_n=0", "run.keep_checkpoints=10", *VARIED_RULE])
    manager = RunManager(root)
    run = manager.start(cfg)
    assert wait_until(lambda: not manager.active, 300, every=0.2)
    assert run.read_status()["status"] == "completed", run.read_status()
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import os

    from grpo_app.core.models import cache_root

    os.environ.setdefault("GRPO_APP_CACHE_DIR", str(cache_root()))
    root = tmp_path_factory.mktemp("matrix-runs")
    return {"ewc": _train(root / "ewc", True), "plain": _train(root / "plain", False)}


def _stage_end_checkpoint(run, k):
    """The trainable weights in the checkpoint written when stage k's last step ended (an independent copy)."""
    steps = run.config().stages[k].steps
    return load_file(str(run.checkpoints_dir / f"stage-{k}" / f"checkpoint-{steps}" / "model.safetensors"))


@pytest.mark.parametrize("which", ["ewc", "plain"])
def test_each_stage_end_keeps_the_weights_it_ended_with(runs, which):
    run = runs[which]
    kind, path = run.stage_end_weights(0)
    assert kind == ("anchor" if which == "ewc" else "weights")
    kept = load_file(str(path))
    if kind == "anchor":
        kept = {k.split("::", 1)[1]: t for k, t in kept.items() if k.startswith("anchor::")}
    ck = _stage_end_checkpoint(run, 0)
    assert kept and set(kept) <= set(ck)
    for name, t in kept.items():
        assert torch.equal(t, ck[name].float()), name
    assert run.stage_end_weights(1) == ("final", run.final_dir)
    assert (run.stage_ends_dir.is_dir()) is (which == "plain")  # with EWC the anchor is the copy


def test_the_matrix_scores_every_stage_model_on_every_task(runs):
    from grpo_app.evaluation.scoring import CompareSpec, evaluate, load_for_eval

    run = runs["plain"]
    m = stage_matrix(run, n=6, seed=0, max_new_tokens=8)
    assert m["stages"] == ["s1", "s2"] and [t["n"] for t in m["tasks"]] == [6, 6]
    assert len(m["rows"]) == 2 and all(len(r) == 2 for r in m["rows"]) and len(m["base"]) == 2
    # the last row is the final model's own scores on the same problems, scored here independently
    model, tok, _ = load_for_eval(str(run.final_dir))
    for j in range(2):
        spec = CompareSpec.for_run(run, f"stage:{j}", 6, 0, max_new_tokens=8)
        probs, _ = spec.problems()
        direct = evaluate(model, tok, probs, spec.settings)["records"]
        assert m["rows"][1][j]["correct"] == sum(r["correct"] for r in direct)
        # the floor a constant answer earns, counted here from the same problems
        golds = [str(p.answer) for p in probs]
        assert m["tasks"][j]["modal_share"] == max(golds.count(g) for g in golds) / len(golds)
        assert golds.count(m["tasks"][j]["modal_answer"]) == max(golds.count(g) for g in golds)
    acc = [[c["accuracy"] for c in row] for row in m["rows"]]
    base = [c["accuracy"] for c in m["base"]]
    assert m["backward_transfer"] == pytest.approx(acc[1][0] - acc[0][0])
    assert m["forward_transfer"] == pytest.approx(acc[0][1] - base[1])
    assert m["plasticity"] == pytest.approx([acc[0][0] - base[0], acc[1][1] - acc[0][1]])
    for k, row in enumerate(m["rows"]):
        for j, cell in enumerate(row):
            before = m["rows"][k - 1][j] if k else m["base"][j]
            assert cell["vs_before"]["delta"] == pytest.approx(cell["accuracy"] - before["accuracy"])
            assert 0 <= cell["ci"][0] <= cell["accuracy"] <= cell["ci"][1] <= 1
    text = summary_sentence(m)
    assert "plasticity" in text and "Backward transfer" in text and "Forward transfer" in text


def test_a_run_without_stage_end_weights_is_refused_with_a_reason(runs, tmp_path):
    from grpo_app.core.run_folder import RunDir

    unfinished = RunDir.create(tmp_path, load_config("tests/configs/tiny.yaml", ["ewc.enabled=false"]))
    with pytest.raises(MatrixError, match="no weights for the end of stage 1, 2"):
        stage_matrix(unfinished, n=4)


def test_cli_compare_matrix_prints_the_table_and_saves_it(runs, capsys):
    import json

    from grpo_app.cli import main

    run = runs["ewc"]
    root = str(run.path.parent)
    assert main(["compare", "--run", run.id, "--matrix", "--n", "4", "--max-new-tokens", "8", "--runs-dir", root]) == 0
    out = capsys.readouterr().out
    assert f"Stage x task matrix of run {run.id} (EWC on, lambda 1000)" in out
    lines = out.splitlines()
    assert any(ln.startswith("base ") for ln in lines) and sum(ln.startswith("after stage ") for ln in lines) == 2
    assert "Backward transfer" in out and "p=" in out
    saved = json.loads((run.eval_dir / "matrix-n4-seed0-t8.json").read_text())
    for j, t in enumerate(saved["tasks"]):  # each task's floor, under the table
        assert f"most common answer, {t['modal_answer']}, is right on {100 * t['modal_share']:.0f}%" in lines[
            next(i for i, ln in enumerate(lines) if ln.startswith(f"task {j + 1}: "))]
    assert len(saved["rows"]) == 2 and saved["ewc"]["enabled"] is True
    for argv, words in ((["--matrix", "--run", run.id, "--stage", "1"], "leave out --stage"),
                        (["--matrix"], "--matrix needs --run")):
        assert main(["compare", *argv, "--runs-dir", root]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err


@pytest.mark.parametrize("lam", [None, 0])
def test_a_stage_trains_with_its_own_ewc_lambda(tmp_path, monkeypatch, varied_reward, lam):
    """Issue 42, goal 3: stage 2's ewc_lam (empty = ewc.lam, 1000 here) is the λ its penalty uses; 0 = none."""
    from grpo_app.core.models import cache_root

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))
    over = ["run.eval_n=0", "run.save_every=0", "stages[1].learning_rate=0.002",
            "rewards.weights={correctness: 1.0, text_length: 1.0}"]  # rewards that differ: the weights move
    if lam is not None:
        over.append(f"stages[1].ewc_lam={lam}")
    manager = RunManager(tmp_path)
    run = manager.start(load_config("tests/configs/tiny.yaml", over))
    assert wait_until(lambda: not manager.active, 300, every=0.2)
    stage2 = [m for m in run.metrics() if m["stage"] == 1]
    assert len(stage2) == 2
    penalties = [m["ewc_penalty"] for m in stage2]
    assert all(p > 0 for p in penalties[1:]) if lam is None else all(p == 0 for p in penalties), penalties
    assert "stages:\n" in run.config_path.read_text() and run.config().stages[1].learning_rate == 0.002


def test_a_replay_stage_trains_on_earlier_problems_and_says_so(tmp_path, monkeypatch):
    """Issue 42, goal 4: with replay, stage 2's steps train on stage 1's problems too (the record shows their
    ids), and the run log says how many were replayed."""
    from grpo_app.core.fileio import read_jsonl
    from grpo_app.core.models import cache_root
    from grpo_app.ui import render

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))
    cfg = load_config("tests/configs/tiny.yaml", ["run.eval_n=0", "run.save_every=0", "stages[1].replay=0.9"])
    manager = RunManager(tmp_path)
    run = manager.start(cfg)
    assert wait_until(lambda: not manager.active, 300, every=0.2)
    stage1_ids = f"arith-{cfg.data.seed}-"  # stage k draws with seed data.seed + k
    second = [i for r in read_jsonl(run.trained_path) if r["stage"] == 1 for i, _ in r["problems"]]
    assert second and sum(i.startswith(stage1_ids) for i in second) >= len(second) - 1, second
    start = next(e for e in run.events() if e["event"] == "stage_start" and e["stage"] == 1)
    assert start["replayed"] == 14 and "14 of them replayed from earlier stages" in render.event_line(start)


def test_a_saved_matrix_is_shown_again_until_the_final_model_changes(runs, monkeypatch):
    """A matrix computed once (CLI, bench or page) is read back for the same run, N, seed and budget; a changed
    final model makes it stale."""
    import os

    from grpo_app.evaluation import stage_matrix as sm

    run = runs["plain"]
    first = sm.stage_matrix(run, n=3, max_new_tokens=8)
    assert sm.matrix_path(run, 3, 0, 8).is_file()

    def no_scoring(*a, **k):
        raise AssertionError("scored again")

    monkeypatch.setattr(sm, "evaluate", no_scoring)
    monkeypatch.setattr(sm, "score_model", no_scoring)
    assert sm.stage_matrix(run, n=3, max_new_tokens=8) == first  # read back, nothing scored
    with pytest.raises(AssertionError, match="scored again"):
        sm.stage_matrix(run, n=3, seed=1, max_new_tokens=8)  # another seed: computed
    weights = next(run.final_dir.glob("*.safetensors"))
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the final model written again
    assert sm.saved_matrix(run, 3, 0, 8) is None
    with pytest.raises(AssertionError, match="scored again"):
        sm.stage_matrix(run, n=3, max_new_tokens=8)


def test_a_matrix_is_labelled_with_every_stage_lambda_that_differs_from_the_runs(runs):
    """A run whose stage 3 trained at its own λ must not be titled with the run's λ alone; stage 1's λ never acts,
    so it is not named; a matrix saved before the per-stage λ were recorded gets them from the run's config."""
    import json

    from grpo_app.evaluation import stage_matrix as sm

    assert sm.ewc_label({"ewc": {"enabled": False, "lam": 10.0}}) == "no EWC"
    assert sm.ewc_label({"ewc": {"enabled": True, "lam": 10.0}}) == "EWC λ 10"
    assert sm.ewc_label({"ewc": {"enabled": True, "lam": 10.0, "stage_lams": [0.0, 10.0, 3.0]}}) == \
        "EWC λ 10; stage 3 λ 3"
    assert sm.ewc_label({"ewc": {"enabled": True, "lam": 1000.0, "stage_lams": [1000.0, 300.0]}},
                        lam="lambda") == "EWC lambda 1000; stage 2 lambda 300"

    run = runs["ewc"]
    m = sm.stage_matrix(run, n=2, seed=7, max_new_tokens=8)
    cfg = run.config()
    assert m["ewc"]["stage_lams"] == [float(st.ewc_lam if st.ewc_lam is not None else cfg.ewc.lam)
                                      for st in cfg.stages]
    path = sm.matrix_path(run, 2, 7, 8)
    old = json.loads(path.read_text())
    old["ewc"] = {"enabled": True, "lam": 99.0}  # as saved before: the run's λ only (and here a wrong one)
    path.write_text(json.dumps(old))
    assert sm.saved_matrix(run, 2, 7, 8)["ewc"] == sm.ewc_settings(cfg)


def test_a_task_with_no_held_out_problems_left_is_refused_not_scored_as_zero(runs, monkeypatch):
    from grpo_app.evaluation import stage_matrix as sm
    from grpo_app.evaluation.scoring import CompareSpec

    monkeypatch.setattr(CompareSpec, "problems", lambda self, exclude=None: ([], "held-out nothing"))
    with pytest.raises(sm.MatrixError, match="no held-out problems left"):
        sm.stage_matrix(runs["plain"], n=5, seed=7, max_new_tokens=8)


def test_the_ewc_movement_bench_measures_how_far_each_stage_moved(runs):
    """bench/ewc_movement.py: its penalty sum is the one computed from the stage-end checkpoints (an independent
    copy), its bands cover every weight the Fisher covers once, and no weight moved further than Adam can."""
    from bench.ewc_movement import _first_fisher, movement

    fisher = _first_fisher(runs["ewc"])
    with pytest.raises(SystemExit, match="fisher-from"):
        _first_fisher(runs["plain"])
    for which in ("ewc", "plain"):
        run = runs[which]
        res = movement(run, fisher)
        assert res["ewc"] is (which == "ewc") and [s["stage"] for s in res["stages"]] == [2]
        s = res["stages"][0]
        assert sum(b["weights"] for b in s["bands"].values()) == sum(f.numel() for f in fisher.values())
        before, after = _stage_end_checkpoint(run, 0), _stage_end_checkpoint(run, 1)
        expected = 0.5 * sum(float((f * (after[n].float() - before[n].float()) ** 2).sum()) for n, f in fisher.items())
        assert expected > 0 and s["half_sum_F_d2"] == pytest.approx(expected, rel=1e-4)
        assert sum(b["penalty_share"] for b in s["bands"].values()) == pytest.approx(1.0, abs=1e-3)
        assert all(0 < b["rms_in_lr"] <= 1.5 * s["steps"] for b in s["bands"].values())


def test_a_branch_after_stage_1_may_drop_or_reweigh_the_penalty_but_not_invent_its_fisher():
    """bench/stage_branch.differences: stage 1 never has a penalty, so a branch after it may turn EWC off or
    change λ; after stage 2 (trained under the penalty) λ must match; a source without EWC kept no Fisher, so
    a branch that turns it on is refused."""
    from bench.stage_branch import differences

    def cfg(*sets):
        return load_config("tests/configs/tiny.yaml", ["stages[1].steps=1", *sets])

    ewc, lam5, off = cfg("ewc.enabled=true"), cfg("ewc.enabled=true", "ewc.lam=5"), cfg("ewc.enabled=false")
    assert differences(ewc, off, 1) == [] and differences(ewc, lam5, 1) == []
    assert differences(ewc, cfg("ewc.enabled=true", "ewc.fisher_samples=3"), 1) == [
        f"ewc.fisher_samples: {ewc.ewc.fisher_samples} in the source, 3 here"]
    assert any(d.startswith("ewc.lam:") for d in differences(ewc, lam5, 2))
    assert differences(off, ewc, 1) == ["ewc.enabled: False in the source, True here"]


def test_a_branch_may_change_the_grouping_or_the_seed_only_when_allowed():
    """bench/stage_branch.differences with `allow`: the named settings may differ, no other one."""
    from bench.stage_branch import differences

    src = load_config("tests/configs/tiny.yaml", ["stages[1].steps=1"])
    other = load_config("tests/configs/tiny.yaml", ["stages[1].steps=1", "grpo.prompts_per_step=3", "run.seed=7",
                                                    "grpo.max_completion_length=9"])
    found = differences(src, other, 1)
    assert {d.split(":")[0] for d in found} == {"grpo.prompts_per_step", "grpo.max_completion_length", "run.seed"}
    kept = differences(src, other, 1, ("grpo.prompts_per_step", "run.seed"))
    assert [d.split(":")[0] for d in kept] == ["grpo.max_completion_length"]
    scaled = load_config("tests/configs/tiny.yaml", ["stages[1].steps=1", "grpo.scale_rewards=batch"])
    assert [d.split(":")[0] for d in differences(src, scaled, 1)] == ["grpo.scale_rewards"]
    assert differences(src, scaled, 1, ("grpo.scale_rewards",)) == []


def test_a_branch_starts_where_the_source_stood_after_stage_k_and_trains_the_rest(runs, tmp_path, monkeypatch):
    """bench/stage_branch.py: the branch's stage-1 weights and EWC state are the source's, its stage 2 trains
    from them under the source's penalty (the loaded Fisher is active), and a config that differs from the
    source in a stage before the branch point is refused, naming the setting."""
    from bench.stage_branch import branch
    from grpo_app.core.run_folder import RunDir
    from grpo_app.evaluation.stage_matrix import load_stage_model

    src = runs["ewc"]
    scfg = src.config()
    monkeypatch.setenv("GRPO_APP_RUNS_DIR", str(tmp_path / "branches"))
    changed = load_config("tests/configs/tiny.yaml", [
        "ewc.enabled=true", "run.eval_n=0", "run.keep_checkpoints=10", "stages[0].steps=3", *VARIED_RULE])
    with pytest.raises(SystemExit, match=r"stages\[0\]\.steps: 2 in the source, 3 here"):
        branch(src.path, 1, changed)
    cfg = load_config("tests/configs/tiny.yaml", [
        "ewc.enabled=true", "run.eval_n=0", "run.keep_checkpoints=10", "stages[1].learning_rate=0.003", *VARIED_RULE])
    path = branch(src.path, 1, cfg)
    run = RunDir(path)
    assert (run.ewc_dir / "stage-0" / "ewc.safetensors").read_bytes() == (
        src.ewc_dir / "stage-0" / "ewc.safetensors").read_bytes()
    assert [m["step"] for m in run.metrics()] == [m["step"] for m in src.metrics() if m["step"] <= 2]
    manager = RunManager(path.parent)
    manager.resume(run.id)
    assert wait_until(lambda: not manager.active, 300, every=0.2)
    assert run.read_status()["status"] == "completed", run.read_status()
    (s1_src, _), (s1_br, _) = load_stage_model(src, 0, scfg.model.name), load_stage_model(run, 0, scfg.model.name)
    assert all(torch.equal(a, b) for a, b in zip(s1_src.state_dict().values(), s1_br.state_dict().values()))
    stage2 = [m for m in run.metrics() if m["step"] > 2]
    assert [m["step"] for m in stage2] == [3, 4] and any(m.get("ewc_penalty") for m in stage2)
    final, _ = load_stage_model(run, 1, scfg.model.name)
    assert any(not torch.equal(a, b) for a, b in zip(s1_br.state_dict().values(), final.state_dict().values()))
    plain = branch(src.path, 1, load_config("tests/configs/tiny.yaml", [  # EWC off after stage 1: no anchors
        "ewc.enabled=false", "run.eval_n=0", "run.keep_checkpoints=10", *VARIED_RULE]))  # kept, the weights are
    assert not (RunDir(plain).ewc_dir / "stage-0").exists() and RunDir(plain).stage_end_weights(0)[0] == "weights"
    s1_plain, _ = load_stage_model(RunDir(plain), 0, scfg.model.name)
    assert all(torch.equal(a, b) for a, b in zip(s1_src.state_dict().values(), s1_plain.state_dict().values()))
