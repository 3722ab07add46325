"""The pre-start estimate of one step's memory and time: calibrated against the project's own measurements,
the presets pass, and a step that cannot fit is refused before anything starts, with the estimate shown."""

import json
from pathlib import Path

import pytest

from grpo_app.core.config import ConfigError, load_config
from grpo_app.runs.manager import RunManager
from grpo_app.training import estimate as E
from grpo_app.ui.forms import MAX_COMPLETION_TOKENS, MAX_PROMPTS_PER_STEP

ASSETS = Path("assets")
# The machine the presets are written for: 2 cores at the matmul rate bench/step_speed.py measured there,
# and a laptop's 16 GB.
REFERENCE = E.Machine(
    available_bytes=16 * 2**30, gflops=json.loads((ASSETS / "step_speed.json").read_text())["gemm"]["gflops_peak"]
)
ABSURD = ["grpo.num_generations=64", f"grpo.prompts_per_step={MAX_PROMPTS_PER_STEP}",
          f"grpo.max_completion_length={MAX_COMPLETION_TOKENS}", "grpo.micro_batch_size=0"]  # each within its limit


@pytest.mark.parametrize("preset", sorted(p.stem for p in Path("configs").glob("*.yaml")))
def test_every_preset_fits_the_reference_machine(preset):
    est = E.check_step(load_config(f"configs/{preset}.yaml"), REFERENCE, max_minutes=15)
    assert est is not None and est.peak_bytes < 8 * 2**30 and est.seconds < 15 * 60


def test_memory_estimate_matches_the_measured_peaks():
    """assets/memory.json: the quick preset with layer recompute on (the calibration point) and off (a check)."""
    measured = json.loads((ASSETS / "memory.json").read_text())["variants"]
    for variant, over in (("preset", []), ("no_checkpointing", ["grpo.gradient_checkpointing=false"])):
        est = E.estimate_step(load_config("quick", over), REFERENCE)
        peak_mb = measured[variant]["peak_rss_mb"]
        assert abs(est.peak_bytes / 2**20 - peak_mb) < 0.05 * peak_mb, (variant, est.summary())


def test_time_estimate_bounds_the_measured_step():
    """assets/step_speed.json `engine`: 65.7 s a step with completions of 94.6 tokens on average (budget 128).
    The estimate assumes every completion runs to its budget: above the measurement, and not by much."""
    eng = json.loads((ASSETS / "step_speed.json").read_text())["engine"]
    cfg = load_config("quick", ["grpo.num_generations=4", "grpo.prompts_per_step=16", "grpo.max_completion_length=128",
                                "grpo.micro_batch_size=8", "stages[0].source=gsm8k"])
    est = E.estimate_step(cfg, REFERENCE)
    assert eng["s_per_step"] < est.seconds < 1.6 * eng["s_per_step"], est.summary()
    assert est.micro_batch_seconds < 30  # the longest stretch a stop cannot cut


def test_an_absurd_combination_is_refused_with_the_estimate():
    cfg = load_config("classroom", ABSURD)
    with pytest.raises(ConfigError) as e:
        E.check_step(cfg, REFERENCE, max_minutes=15)
    (path, msg), = e.value.errors
    assert path == "one training step"
    assert f"{MAX_PROMPTS_PER_STEP} prompts x G = 64 completions of up to {MAX_COMPLETION_TOKENS} tokens" in msg
    assert "MB available" in msg and "limit of 15 min a step" in msg  # both: memory and time
    assert "peak memory ~" in msg and "KV cache" in msg and "GFLOP/s measured" in msg  # the estimate itself
    assert "Lower G" in msg
    # time alone: plenty of memory, a short limit
    big = E.Machine(available_bytes=2**40, gflops=REFERENCE.gflops)
    with pytest.raises(ConfigError, match="over the limit of 0.25 min a step") as e:
        E.check_step(load_config("classroom"), big, max_minutes=0.25)  # ~34 s a step at the reference rate
    assert "MB available" not in e.value.errors[0][1]
    assert E.check_step(load_config("classroom"), big, max_minutes=0) is not None  # 0 = no time limit


def test_start_refuses_it_before_creating_anything(tmp_path, monkeypatch):
    """RunManager.start (the web app and the CLI) measures this machine and refuses: ~95 GB of KV cache."""
    monkeypatch.setenv("GRPO_APP_MAX_STEP_MINUTES", "15")
    mgr = RunManager(tmp_path / "runs")
    with pytest.raises(ConfigError, match="one training step.*needs ~"):
        mgr.start(load_config("classroom", ABSURD))
    assert mgr.runs() == [] and not mgr.active


def test_the_web_form_shows_the_refusal(tmp_path, monkeypatch):
    from grpo_app.core.models import cache_root
    from grpo_app.ui.forms import TrainForm
    from grpo_app.ui.studio import Studio

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))
    monkeypatch.setenv("GRPO_APP_MODELS_DIR", str(tmp_path / "models"))
    studio = Studio(manager=RunManager(tmp_path / "runs"), configs_dir="configs", default_preset="classroom")
    values, _ = studio.train.preset_form("classroom")
    values.update(num_generations=64, prompts_per_step=MAX_PROMPTS_PER_STEP, max_completion_length=MAX_COMPLETION_TOKENS)
    res = studio.train.start(TrainForm(preset="classroom", **values))
    assert not res.ok and "Nothing was started" in res.message and "one training step" in res.message
    assert "peak memory ~" in res.message and studio.manager.runs() == []


def test_a_model_whose_shape_cannot_be_read_is_not_refused():
    cfg = load_config("classroom", ["model.name=someone/unknown-model"])
    assert E.model_shape("someone/unknown-model") is None and E.check_step(cfg, REFERENCE) is None


def test_the_embedded_shape_is_its_config():
    from grpo_app.core.models import cache_root

    path = cache_root() / "smollm2-135m-instruct-f32" / "config.json"
    if not path.is_file():
        pytest.skip("the embedded model has not been unpacked here")
    raw = json.loads(path.read_text())
    shape = E.model_shape("embedded")
    assert {k: shape[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")} == {
        k: raw[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")
    }


def test_cli_train_refuses_it_with_exit_code_2(tmp_path, monkeypatch, capsys):
    from grpo_app import cli

    monkeypatch.setenv("GRPO_APP_RUNS_DIR", str(tmp_path / "runs"))
    sets = [x for over in ABSURD for x in ("--set", over)]
    assert cli.main(["train", "--config", "classroom", *sets]) == 2
    err = capsys.readouterr().err
    assert "Invalid configuration" in err and "one training step" in err and "KV cache" in err
    assert "Traceback" not in err and not (tmp_path / "runs").exists()


def test_fewer_trained_layers_estimate_less_memory_and_a_shorter_training_pass():
    """model.trainable_layers=15 of SmolLM2's 30: half the layers' gradients and optimizer state go, and the
    frozen half runs its forward only (2 of the 8 FLOPs per parameter and token with recompute)."""
    full = E.estimate_step(load_config("classroom"), REFERENCE)
    top = E.estimate_step(load_config("classroom", ["model.trainable_layers=15"]), REFERENCE)
    assert top.sampling_seconds == full.sampling_seconds
    assert 0.5 < top.training_seconds / full.training_seconds < 0.75
    half = 15 * (576 * 64 * 9 * 2 + 576 * 64 * 3 * 2 + 3 * 576 * 1536 + 2 * 576)  # one half's parameters
    assert full.memory_parts["gradients"] - top.memory_parts["gradients"] == 4 * half  # fp32
    assert load_config("classroom").grpo.optimizer == "adamw_bf16_moments"
    assert full.memory_parts["optimizer"] - top.memory_parts["optimizer"] == 4 * half  # two bf16 moments


def test_more_trained_layers_than_the_model_has_are_refused_before_a_run_folder_exists(tmp_path):
    """model.trainable_layers=31 on SmolLM2's 30 layers: refused by the start check with the valid range (the
    model load refuses it too, but only once a run folder exists); 30, all of them, passes."""
    with pytest.raises(ConfigError) as e:
        E.check_step(load_config("classroom", ["model.trainable_layers=31"]), REFERENCE)
    (path, msg), = e.value.errors
    assert path == "model.trainable_layers" and "has 30 decoder layers" in msg and "use 1-30, or 0" in msg
    assert E.check_step(load_config("classroom", ["model.trainable_layers=30"]), REFERENCE) is not None
    mgr = RunManager(tmp_path / "runs")
    with pytest.raises(ConfigError, match="30 decoder layers"):
        mgr.start(load_config("classroom", ["model.trainable_layers=99"]))
    assert mgr.runs() == [] and not mgr.active


def test_a_kl_term_in_any_stage_counts_the_reference_models_weights_and_forward():
    """A stage with its own beta > 0 holds a frozen copy of the policy (trainer.py, departure 9) and runs its
    forward over the step's tokens: the estimate carries both, for the worst stage."""
    for recompute, passes in ((True, 8), (False, 6)):  # FLOPs per parameter and token: forward 2, backward 4, recompute 2
        gc = f"grpo.gradient_checkpointing={str(recompute).lower()}"
        plain = E.estimate_step(load_config("progressive", [gc]), REFERENCE)
        kl = E.estimate_step(load_config("progressive", [gc, "stages[2].beta=0.2"]), REFERENCE)
        assert "KL reference model" not in plain.memory_parts
        assert kl.memory_parts["KL reference model"] == plain.memory_parts["weights"]
        assert kl.training_seconds / plain.training_seconds == pytest.approx((passes + 2) / passes, rel=0.02)  # + a forward


def test_packed_sampling_counts_a_second_copy_of_the_weights_while_sampling():
    """grpo.packed_sampling: the sampler holds a oneDNN-packed copy of every weight (sampler.packed_linears);
    with layer recompute on, sampling becomes the quick preset's highest phase."""
    plain = E.estimate_step(load_config("quick"), REFERENCE)
    packed = E.estimate_step(load_config("quick", ["grpo.packed_sampling=true"]), REFERENCE)
    assert packed.peak_phase == "sampling" and packed.memory_parts["packed weights"] == plain.memory_parts["weights"]
    assert packed.peak_bytes > plain.peak_bytes and packed.seconds == plain.seconds
    off = E.estimate_step(load_config("quick", ["grpo.packed_sampling=true", "grpo.fast_generation=false"]), REFERENCE)
    assert "packed weights" not in off.memory_parts  # TRL's own generate samples then: nothing is packed
