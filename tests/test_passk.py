"""pass@k: the unbiased estimator against counting subsets, the bootstrap curve, sampling with a model whose
answer distribution is known, a base-vs-trained comparison, its chart and the CLI flags."""

import itertools
import math

import numpy as np
import pytest
import torch

from grpo_app.core.data import Problem
from grpo_app.evaluation import scoring as evaluation
from grpo_app.evaluation.scoring import EvalSettings, pass_k_rows, sample_pass_k
from grpo_app.evaluation.stats import pass_at_k, pass_k_curve
from grpo_app.ui.charts import passk_figure

from .conftest import make_tiny


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (1, 0, 1, 0.0),  # one wrong sample
        (1, 1, 1, 1.0),  # one right sample
        (4, 1, 1, 0.25),  # pass@1 is the fraction right
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2)
        (5, 0, 3, 0.0),  # nothing right: never
        (5, 3, 3, 1.0),  # fewer wrong samples (2) than tries (3): always
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (16, 16, 16, 1.0),
    ],
)
def test_pass_at_k_hand_cases(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_the_chance_that_k_of_the_n_samples_hold_a_right_one():
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                direct = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(direct, abs=1e-12), (n, c, k)
    for bad in ((4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_curve_is_the_mean_over_problems_with_a_bootstrap_interval():
    correct = [0, 0, 1, 3, 8, 2, 0, 5, 8, 1]
    cv = pass_k_curve(correct, 8, seed=1)
    assert cv["k"] == list(range(1, 9)) and cv["n_problems"] == 10
    for i, k in enumerate(cv["k"]):
        assert cv["pass"][i] == pytest.approx(np.mean([pass_at_k(8, c, k) for c in correct]))
        lo, hi = cv["ci"][i]
        assert 0 <= lo <= cv["pass"][i] <= hi <= 1
    assert cv["pass"] == sorted(cv["pass"]) and cv["pass"][0] == pytest.approx(sum(correct) / 80)
    assert pass_k_curve(correct, 8, seed=1) == cv  # seeded
    # the multinomial draw is a bootstrap over problems: compare with resampling the problems themselves
    many = correct * 4  # 40 problems: a smoother distribution of resampled means
    cv = pass_k_curve(many, 8, seed=1, resamples=20000)
    rng = np.random.default_rng(0)
    per = np.array([[pass_at_k(8, c, k) for k in range(1, 9)] for c in many])
    direct = per[rng.integers(0, 40, size=(20000, 40))].mean(axis=1)
    lo, hi = np.percentile(direct, [2.5, 97.5], axis=0)
    assert np.allclose([c[0] for c in cv["ci"]], lo, atol=0.02) and np.allclose([c[1] for c in cv["ci"]], hi, atol=0.02)


def test_settings_check_pass_k_and_temperature():
    EvalSettings(pass_k=16, pass_temperature=0.7).validate()
    with pytest.raises(ValueError, match="pass@k samples"):
        EvalSettings(pass_k=65).validate()
    with pytest.raises(ValueError, match="temperature"):
        EvalSettings(pass_k=4, pass_temperature=0.0).validate()
    EvalSettings(pass_k=0, pass_temperature=0.0).validate()  # off: the temperature is not used
    plain = evaluation.cache_key(["tiny-random"], EvalSettings())
    assert plain == evaluation.cache_key(["tiny-random"], EvalSettings(pass_temperature=0.3))
    assert plain != evaluation.cache_key(["tiny-random"], EvalSettings(pass_k=4))


# ------------------------------------------------------------------------------------------------
# Sampling with a model whose answers are known: it writes one digit, then stops (or stops at once)
# ------------------------------------------------------------------------------------------------
def digit_model(tokenizer, p_seven: float):
    """A tiny model whose next token is EOS with probability 0.7, else a digit: '7' with p_seven of the rest.
    A right answer to a problem with gold 7 is '7' then EOS: probability 0.3 * p_seven * 0.7 per sample."""
    model = make_tiny(tokenizer)
    digits = [tokenizer.encode(str(d), add_special_tokens=False)[0] for d in range(10)]
    probs = torch.full((10,), (1 - p_seven) / 9)
    probs[7] = p_seven
    bias = torch.full((len(tokenizer),), -1e4)
    bias[digits] = torch.log(0.3 * probs)
    bias[tokenizer.eos_token_id] = math.log(0.7)

    def hook(module, args, out):
        return torch.zeros_like(out) + bias.to(out.dtype)

    model.lm_head.register_forward_hook(hook)
    return model


def _problems(n=12):
    return [Problem(f"p{i}", f"What is {i} + {7 - i}?", "7", "#### 7", 1, "arithmetic") for i in range(n)]


def test_sample_pass_k_counts_right_samples(tokenizer):
    settings = EvalSettings(n=12, max_new_tokens=8, batch_size=16, pass_k=8, pass_temperature=1.0)
    good = sample_pass_k(digit_model(tokenizer, 0.9), tokenizer, _problems(), settings)
    bad = sample_pass_k(digit_model(tokenizer, 0.0), tokenizer, _problems(), settings)
    assert [r["id"] for r in good["records"]] == [f"p{i}" for i in range(12)]
    assert all(r["n"] == 8 and 0 <= r["correct"] <= 8 for r in good["records"])
    assert all(r["correct"] == 0 for r in bad["records"])  # '7' never sampled: never right
    assert bad["curve"]["pass"] == [0.0] * 8
    # per sample 0.3 * 0.9 * 0.7 = 0.189 right: pass@1 near it, pass@8 near 1 - 0.811^8 = 0.81
    cv = good["curve"]
    assert 0.08 < cv["pass"][0] < 0.32 and 0.6 < cv["pass"][-1] <= 1.0
    assert all(a <= b + 1e-12 for a, b in zip(cv["pass"], cv["pass"][1:]))
    again = sample_pass_k(digit_model(tokenizer, 0.9), tokenizer, _problems(), settings)
    assert again["records"] == good["records"]  # seeded


def test_compare_with_pass_k_gives_both_curves_table_and_chart(tokenizer, monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_APP_MODELS_DIR", str(tmp_path))  # a fresh evaluation cache
    models = {"base-model": digit_model(tokenizer, 0.1), "trained-model": digit_model(tokenizer, 0.9)}
    spec = type("Spec", (), {})
    monkeypatch.setattr(
        evaluation, "load_for_eval", lambda name, int8=False, restrict=False: (models[name], tokenizer, spec())
    )
    monkeypatch.setattr(evaluation, "_model_fingerprint", lambda name: name)
    monkeypatch.setattr(evaluation, "eval_problems", lambda settings, data_cfg=None, exclude=None: (_problems(), "hand"))
    spec.label = "digits"
    seen = []
    settings = EvalSettings(n=12, max_new_tokens=8, batch_size=16, pass_k=6, pass_temperature=1.0)
    res = evaluation.compare_models(
        "base-model", "trained-model", settings, progress=lambda role, d, t: seen.append((role, d, t))
    )
    for role in ("base", "trained"):
        cv = res[role]["pass_k"]["curve"]
        assert cv["k"] == [1, 2, 3, 4, 5, 6] and len(cv["pass"]) == len(cv["ci"]) == 6
        assert all(a <= b + 1e-12 for a, b in zip(cv["pass"], cv["pass"][1:]))  # non-decreasing in k
        assert res[role]["pass_k"]["temperature"] == 1.0
    assert res["trained"]["pass_k"]["curve"]["pass"][-1] > res["base"]["pass_k"]["curve"]["pass"][-1]
    assert seen[-1] == ("trained", 12 * 7, 12 * 7)  # progress counts 12 greedy + 12 x 6 sampled answers
    rows = pass_k_rows(res)
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0][1] == res["base"]["pass_k"]["curve"]["pass"][0]
    fig = passk_figure(res).figure()
    assert len(fig.data) == 2 and {t.name.split(":")[0] for t in fig.data} == {"base", "trained"}
    assert list(fig.data[1].y) == res["trained"]["pass_k"]["curve"]["pass"]
    assert list(fig.data[0].x) == [1, 2, 3, 4, 5, 6]
    again = evaluation.compare_models("base-model", "trained-model", settings)
    assert again["cached"] and again["base"]["pass_k"]["curve"] == res["base"]["pass_k"]["curve"]
    # without pass@k: no curve, and the chart says how to get one
    assert not pass_k_rows({"base": {}, "trained": {}})
    assert len(passk_figure({"base": {}, "trained": {}}).figure().data) == 0


def test_cli_compare_pass_k_flags_are_checked():
    import subprocess
    import sys

    from .conftest import ROOT

    r = subprocess.run(
        [sys.executable, "-m", "grpo_app", "compare", "--trained", "tiny-random", "--pass-k", "4", "--temperature", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "temperature" in r.stderr and "Traceback" not in r.stderr
