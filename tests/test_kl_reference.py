"""grpo.beta > 0: the KL term's reference is the policy as the stage began (trainer.py, departure 9), not the
model TRL would load again from the run's starting folder (the base model, in every stage). Resumed inside a
stage, the reference is rebuilt from the weights the run kept at the previous stage's end."""

from __future__ import annotations

import shutil

import pytest
import torch

from grpo_app.core.config import ConfigError, load_config
from grpo_app.core.run_folder import RunDir
from grpo_app.training import engine


def _cfg(tmp_path, *extra):
    return load_config("tests/configs/tiny.yaml", [
        f"run.output_dir={tmp_path}", "grpo.beta=0.04", "rewards.weights={text_length: 1.0}", *extra])


class Refs:
    """Records, at each trainer's construction, the reference TRL ended up with and the policy it was given."""

    def __init__(self, monkeypatch):
        self.seen = []
        orig = engine.CurriculumGRPOTrainer.__init__

        def init(tr, *a, **k):
            policy = {n: p.detach().clone() for n, p in k["model"].named_parameters()}
            orig(tr, *a, **k)
            ref = {n: p.detach().clone() for n, p in tr.ref_model.named_parameters()}
            self.seen.append((policy, ref, tr.ref_model is tr.model, any(p.requires_grad for p in tr.ref_model.parameters())))

        monkeypatch.setattr(engine.CurriculumGRPOTrainer, "__init__", init)


class Metrics(engine.Reporter):
    """Keeps every step's metrics record."""

    def __init__(self):
        self.rows = []

    def metrics(self, rec):
        self.rows.append(rec)


def _died_in_stage_two(tmp_path, *extra) -> tuple:
    """A run trained to the end, then put back to its checkpoint after stage 2's first step, as if the process
    had died there: (cfg, run)."""
    cfg = _cfg(tmp_path, "run.save_every=1", "run.keep_checkpoints=10", "stages[1].steps=3", *extra)
    run = RunDir.create(tmp_path, cfg)
    assert engine.train(cfg, run) == "completed"
    for ck in (run.checkpoints_dir / "stage-1").glob("checkpoint-*"):
        if ck.name != "checkpoint-1":
            shutil.rmtree(ck)
    shutil.rmtree(run.final_dir)
    return cfg, run


def _same(a: dict, b: dict, names=None) -> bool:
    return all(torch.equal(a[n], b[n]) for n in (names or a))


@pytest.mark.parametrize("ewc", [True, False])
def test_each_stage_is_measured_against_the_policy_it_started_from(tmp_path, varied_reward, monkeypatch, ewc):
    refs = Refs(monkeypatch)
    cfg = _cfg(tmp_path, "run.save_every=0", f"ewc.enabled={str(ewc).lower()}")
    rows = (reporter := Metrics()).rows
    assert engine.train(cfg, RunDir.create(tmp_path, cfg), reporter=reporter) == "completed"
    (p1, r1, same1, grad1), (p2, r2, same2, grad2) = refs.seen
    assert _same(r1, p1) and _same(r2, p2)  # a copy of the policy as each stage began
    assert not (same1 or same2 or grad1 or grad2)  # a separate, frozen model
    assert not _same(r2, r1)  # stage 2's reference is not the base model: stage 1 moved the weights
    kl = [(m["stage"], m["kl"]) for m in rows]
    assert [s for s, _ in kl] == [0, 0, 1, 1]
    assert kl[0][1] == pytest.approx(0.0, abs=1e-7) and kl[2][1] == pytest.approx(0.0, abs=1e-7)  # first step: policy = reference
    assert kl[1][1] > 1e-5  # ... and the KL is measured as the policy moves (against the base it would start > 0 in stage 2)


@pytest.mark.parametrize("ewc", [True, False])
def test_resumed_inside_a_stage_the_reference_is_the_kept_stage_start(tmp_path, varied_reward, monkeypatch, ewc):
    cfg, run = _died_in_stage_two(tmp_path, f"ewc.enabled={str(ewc).lower()}")
    kept = run.stage_end_state(0)
    assert kept, "the run keeps the end of stage 1"
    assert run.latest_checkpoint()["stage_index"] == 1 and run.latest_checkpoint()["stage_step"] == 1

    refs = Refs(monkeypatch)
    assert engine.train(cfg, run, resume=True) == "completed"
    ((policy, ref, _, _),) = refs.seen
    assert _same(kept, ref, kept)  # the stage's start, read from what the run kept (anchor or stage_ends/)
    assert not _same(kept, policy, kept)  # while the policy still held the weights it was loaded with
    frozen = set(ref) - set(kept)
    assert frozen and _same(policy, ref, frozen)  # frozen weights (the embeddings) are the loaded model's


def test_a_resume_that_cannot_rebuild_the_reference_says_so(tmp_path, varied_reward):
    cfg, run = _died_in_stage_two(tmp_path, "ewc.enabled=false")
    shutil.rmtree(run.stage_ends_dir)  # a run that did not keep the end of stage 1
    with pytest.raises(RuntimeError, match="needs the weights this run had when stage 1 ended"):
        engine.train(cfg, run, resume=True)


def test_a_stage_can_have_its_own_beta(tmp_path, varied_reward, monkeypatch):
    cfg = _cfg(tmp_path, "run.save_every=0", "grpo.beta=0", "stages[1].beta=0.1")
    assert (cfg.stage_beta(0), cfg.stage_beta(1)) == (0.0, 0.1)
    given, rows = [], (reporter := Metrics()).rows
    orig = engine.CurriculumGRPOTrainer.__init__

    def init(tr, *a, **k):
        given.append(k["ref_model"])
        orig(tr, *a, **k)

    monkeypatch.setattr(engine.CurriculumGRPOTrainer, "__init__", init)
    assert engine.train(cfg, RunDir.create(tmp_path, cfg), reporter=reporter) == "completed"
    assert given[0] is None and given[1] is not None  # a reference model only where the stage's beta > 0
    assert [m["kl"] is None for m in rows] == [True, True, False, False]
    with pytest.raises(ConfigError, match="beta"):
        _cfg(tmp_path, "stages[1].beta=-1")


def test_replay_beta_puts_the_kl_term_on_replayed_problems_only(tmp_path, varied_reward, monkeypatch):
    from grpo_app.core.data import stage_pool

    cfg = _cfg(tmp_path, "run.save_every=0", "grpo.beta=0", "stages[1].replay=0.5", "stages[1].replay_beta=0.3",
               "stages[1].steps=3")
    assert (cfg.stage_beta(1), cfg.stage_replay_beta(1), cfg.stage_has_kl(0), cfg.stage_has_kl(1)) == (0, 0.3, False, True)
    own = {p.id for p in stage_pool(cfg.stages[1], cfg.data, seed=cfg.data.seed + 1).problems}
    seen, given, rows = [], [], (reporter := Metrics()).rows
    orig_init, orig_gen = engine.CurriculumGRPOTrainer.__init__, engine.CurriculumGRPOTrainer._generate_and_score_completions

    def init(tr, *a, **k):
        given.append((k["ref_model"], k["args"].beta))
        orig_init(tr, *a, **k)

    def gen(tr, inputs):
        out = orig_gen(tr, inputs)
        seen.append(([x["problem_id"] for x in inputs], out.get("kl_beta")))
        return out

    monkeypatch.setattr(engine.CurriculumGRPOTrainer, "__init__", init)
    monkeypatch.setattr(engine.CurriculumGRPOTrainer, "_generate_and_score_completions", gen)
    assert engine.train(cfg, RunDir.create(tmp_path, cfg), reporter=reporter) == "completed"
    assert given[0] == (None, 0.0) and given[1][0] is not None and given[1][1] == 0.3  # a reference in stage 2 only
    assert all(b is None for _, b in seen[:2])  # stage 1: no KL term at all
    pairs = [(pid in own, round(float(b), 6)) for ids, betas in seen[2:] for pid, b in zip(ids, betas)]
    assert {b for is_own, b in pairs if is_own} == {0.0}  # the stage's own problems: beta 0
    assert {b for is_own, b in pairs if not is_own} == {0.3}  # replayed ones: replay_beta
    assert [m["kl"] is None for m in rows][:2] == [True, True] and rows[-1]["kl"] is not None
    # replay 0.5 of 2 prompts a step: each step of stage 2 trains on exactly one replayed problem (the trainer
    # keeps with_replay's order, where replayed problems are spread evenly)
    assert [len({pid for pid in ids if pid not in own}) for ids, _ in seen[2:]] == [1, 1, 1]


def test_replay_beta_is_checked(tmp_path, varied_reward):
    with pytest.raises(ConfigError, match="replay_beta.*set replay"):
        _cfg(tmp_path, "stages[1].replay_beta=0.2")  # nothing replayed
    with pytest.raises(ConfigError, match="replay_beta"):
        _cfg(tmp_path, "stages[1].replay=0.3", "stages[1].replay_beta=11")
    cfg = _cfg(tmp_path, "stages[1].replay=0.3")  # blank: the stage's beta on every row
    assert cfg.stage_replay_beta(1) == cfg.stage_beta(1) == 0.04
