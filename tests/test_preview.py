"""The Train tab's preview: the config.yaml Start would run and a `python -m grpo_app train` command that
builds the same config (parsed with the CLI's own parser and loaded with load_config)."""

import shlex
from pathlib import Path

import pytest

from grpo_app.cli import build_parser
from grpo_app.core.config import load_config
from grpo_app.runs.manager import RunManager
from grpo_app.ui import forms
from grpo_app.ui.forms import FormError, TrainForm
from grpo_app.ui.preview import config_overrides, preview
from grpo_app.ui.studio import Studio


@pytest.fixture
def studio(tmp_path, monkeypatch):
    from grpo_app.core.models import cache_root

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))
    monkeypatch.setenv("GRPO_APP_MODELS_DIR", str(tmp_path / "models"))
    return Studio(manager=RunManager(tmp_path / "runs"), configs_dir=Path("tests/configs/app"), default_preset="tiny-app")


def run_command(command: str):
    """What the shown command gives the CLI: its parsed arguments and the config load_config builds from them."""
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:4] == ["python", "-m", "grpo_app", "train"]
    args = build_parser().parse_args(argv[3:])
    return args, load_config(args.config, args.set or [])


def form(studio, preset="tiny-app", **over):
    values, _ = studio.train.preset_form(preset)
    values.update(over)
    return TrainForm(preset=preset, **values)


CASES = [
    {},  # the preset unchanged: no --set at all
    {"num_generations": 6, "learning_rate": "2e-5", "seed": 7, "run_name": "my run!"},
    {"stages": [["warm up", "arithmetic", 1, 1, 3], ["two ops", "arithmetic", 2, 2, 4], ["gsm", "gsm_symbolic", 2, 3, 5]]},
    {"stages": [["only", "arithmetic", 1, 2, 9]], "ewc": False, "lora": True, "ewc_lam": 25.5},
    {"model": "embedded", "gsm8k": "offline", "max_completion_length": 64, "prompts_per_step": 3},
]


@pytest.mark.parametrize("over", CASES)
def test_the_shown_command_builds_the_config_start_would_run(studio, over):
    f = form(studio, **over)
    text, command = preview(studio, f)
    expected = forms.build_config(form(studio, **over), studio.train.preset_data("tiny-app"), studio.model_roots(),
                                  studio.manager.root)
    assert text == expected.to_yaml()  # exactly what Start builds
    args, cfg = run_command(command)
    assert args.config == "tests/configs/app/tiny-app.yaml"
    assert cfg.to_dict() == expected.to_dict()
    if not over:
        assert "--set" not in command


def test_overrides_name_only_what_changed(studio):
    base = load_config("tests/configs/app/tiny-app.yaml")
    cfg = load_config("tests/configs/app/tiny-app.yaml", ["grpo.num_generations=6", "stages[1].steps=3",
                                                         "rewards.weights={correctness: 1.0}"])
    assert config_overrides(base, cfg) == [
        "stages[1].steps=3", "rewards.weights={correctness: 1.0}", "grpo.num_generations=6"
    ]


def test_a_preset_of_configs_is_named_by_its_name(tmp_path, monkeypatch):
    from grpo_app.core.models import cache_root

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))
    s = Studio(manager=RunManager(tmp_path / "runs"), default_preset="quick")
    _, command = preview(s, form(s, preset="quick", seed=5))
    args, cfg = run_command(command)
    assert args.config == "quick" and command.splitlines()[0].startswith("python -m grpo_app train --config quick")
    assert cfg.run.seed == 5 and cfg.preset == "quick"


def test_bad_settings_are_reported_not_previewed(studio):
    with pytest.raises(FormError) as e:
        preview(studio, form(studio, num_generations=1))
    assert e.value.errors[0][0] == "grpo.num_generations"
