"""The Train form → Config, with a message per bad value routed to its control (no Gradio needed)."""

from pathlib import Path

import pytest

from grpo_app.ui import forms
from grpo_app.ui.forms import FormError, TrainForm, build_config, check_model_name, parse_stages, route_errors

TINY = Path("tests/configs/app/tiny-app.yaml")


@pytest.fixture
def roots(tmp_path):
    return [tmp_path / "models"]


def base_form(**over) -> TrainForm:
    values = dict(
        preset="tiny-app",
        model="tiny-random",
        gsm8k="auto",
        stages=[["add", "arithmetic", 1, 1, 3], ["three", "arithmetic", 2, 2, 3]],
        num_generations=4,
        max_completion_length=24,
        prompts_per_step=2,
        learning_rate="1e-3",
        ewc=True,
        ewc_lam=100,
        lora=False,
        seed=7,
        run_name="",
    )
    values.update(over)
    return TrainForm(**values)


def build(form, roots, **kw):
    return build_config(form, forms.load_preset_data(TINY), roots, **kw)


def test_a_good_form_gives_the_config_it_shows(roots):
    cfg = build(base_form(num_generations="6", learning_rate="2e-4", seed=3.0, ewc="off", run_name="my run!"), roots)
    assert cfg.model.name == "tiny-random" and cfg.preset == "tiny-app"
    assert [(s.name, s.steps, s.min_difficulty) for s in cfg.stages] == [("add", 3, 1), ("three", 3, 2)]
    assert cfg.stages[0].num_problems == 32  # hidden options come from the preset
    assert (cfg.grpo.num_generations, cfg.grpo.learning_rate, cfg.run.seed, cfg.ewc.enabled) == (6, 2e-4, 3, False)
    assert cfg.rewards.weights == {"correctness": 1.0, "has_number": 1.0}
    assert cfg.run.name == "my-run"


def test_sanitised_run_name_is_noted(roots):
    form = base_form(run_name="../../x")
    assert build(form, roots).run.name == "x" and "changed to 'x'" in form.notes[0]
    form = base_form(run_name="!!!")
    assert build(form, roots).run.name == "" and "no usable characters" in form.notes[0]


@pytest.mark.parametrize(
    "over,path,text",
    [
        ({"num_generations": 1}, "grpo.num_generations", "out of range; use 2 to 64"),  # G must compare >= 2
        ({"num_generations": "eight"}, "grpo.num_generations", "expected a whole number"),
        ({"num_generations": 2.5}, "grpo.num_generations", "expected a whole number"),
        ({"num_generations": True}, "grpo.num_generations", "expected a whole number"),  # bools are not numbers
        ({"max_completion_length": 4}, "grpo.max_completion_length", "out of range"),
        ({"max_completion_length": None}, "grpo.max_completion_length", "enter a whole number"),
        ({"prompts_per_step": 0}, "grpo.prompts_per_step", "out of range"),
        ({"learning_rate": "fast"}, "grpo.learning_rate", "expected a number"),
        ({"learning_rate": "0"}, "grpo.learning_rate", "must be above 0"),
        ({"learning_rate": "nan"}, "grpo.learning_rate", "expected a number"),
        ({"learning_rate": 0.5}, "grpo.learning_rate", "at most 0.01"),
        ({"ewc_lam": -1}, "ewc.lam", "out of range"),
        ({"ewc": "maybe"}, "ewc.enabled", "expected on or off"),
        ({"lora": 3}, "model.lora", "expected on or off"),
        ({"seed": -5}, "run.seed", "out of range"),
        ({"gsm8k": "ftp"}, "data.gsm8k", "is not one of"),
        ({"model": ""}, "model.name", "no model given"),
        ({"model": "../etc"}, "model.name", "'..' are not allowed"),
        ({"model": "/etc"}, "model.name", "outside the model folders"),
        ({"model": "models/runs/x"}, "model.name", "relative path"),
        ({"model": "not a model"}, "model.name", "is not 'embedded', a hub id"),
        ({"model": "x" * 300}, "model.name", "characters long"),
        ({"model": 42}, "model.name", "must be text"),
        ({"stages": []}, "stages", "no stages"),
        ({"stages": "add,1,2"}, "stages", "must be rows"),
        ({"stages": [["a", "arithmetic", 3, 1, 2]]}, "stages[0].max_difficulty", "is empty (max below min)"),
        ({"stages": [["a", "algebra", 1, 1, 2]]}, "stages[0].source", "is not one of"),
        ({"stages": [["a", "arithmetic", 1, 1, 0]]}, "stages[0].steps", "out of range"),
        ({"stages": [["a", "arithmetic", "hard", 2, 2]]}, "stages[0].min_difficulty", "expected a whole number"),
        ({"stages": [["a", "arithmetic", 7, 8, 2]]}, "stages[0].min_difficulty", "must lie in 1..5"),  # from Config
        ({"stages": [["a", "custom", 1, 1, 2]]}, "stages[0].source", "custom_path is empty"),  # no upload
        (
            {"stages": [["a", "arithmetic", 1, 1, 2], ["b", "arithmetic", 1, 1, 5]]},
            "stages[1].min_difficulty",
            "repeats stage 1",
        ),
        ({"stages": [["a", "arithmetic", 1, 1, 2]] * 11}, "stages", "too many"),
        ({"stages": [["a", "arithmetic", 1, 1, 2, "", "", "", "extra"]]}, "stages[0]", "a row has at most 8 cells"),
        ({"stages": [["a", "arithmetic", 1, 1, 2, "fast"]]}, "stages[0].learning_rate", "expected a number"),
        ({"stages": [["a", "arithmetic", 1, 1, 2, "", "-3"]]}, "stages[0].ewc_lam", "out of range"),
        ({"stages": [["a", "arithmetic", 1, 1, 2, "", "", "0.5"]]}, "stages[0].replay", "no earlier stage"),  # Config
        ({"stages": [["a", "arithmetic", 1, 1, 2], ["b", "arithmetic", 2, 2, 2, "", "", "2"]]}, "stages[1].replay",
         "out of range"),
    ],
)
def test_bad_values_name_their_field(roots, over, path, text):
    with pytest.raises(FormError) as e:
        build(base_form(**over), roots)
    assert any(p == path and text in m for p, m in e.value.errors), e.value.errors


def test_every_problem_is_reported_at_once(roots):
    with pytest.raises(FormError) as e:
        build(base_form(num_generations=0, learning_rate="x", seed="s", model="/etc"), roots)
    assert {p for p, _ in e.value.errors} == {"grpo.num_generations", "grpo.learning_rate", "run.seed", "model.name"}


def test_overlapping_but_different_stages_are_a_normal_curriculum(roots):
    cfg = build(base_form(stages=[["a", "arithmetic", 1, 2, 2], ["b", "arithmetic", 2, 3, 2]]), roots)
    assert len(cfg.stages) == 2


def test_blank_rows_are_ignored_and_names_cleaned(roots):
    cfg = build(base_form(stages=[["<b>x</b>", "Arithmetic ", "1", 1.0, "2"], [None, "", None, None, None]]), roots)
    assert [(s.name, s.source, s.steps) for s in cfg.stages] == [("-b-x-b-", "arithmetic", 2)]
    rows = parse_stages({"headers": forms.STAGE_HEADERS, "data": [["a", "gsm8k", 1, 2, 3]]}, [], [])
    assert rows[0]["source"] == "gsm8k"


def test_gsm8k_range_with_too_few_problems(roots, monkeypatch):
    from grpo_app.core.data import Problem

    probs = [Problem(str(i), "q", "1", "#### 1", d, "gsm8k") for i, d in enumerate([1, 2, 2, 3] * 10)]
    monkeypatch.setattr("grpo_app.core.data.load_gsm8k", lambda split, cfg: (probs, "test"))
    with pytest.raises(FormError) as e:
        build(base_form(stages=[["g", "gsm8k", 6, 9, 2]]), roots)
    assert "only 0 GSM8K training problems have difficulty 6..9" in e.value.errors[0][1]
    assert build(base_form(stages=[["g", "gsm8k", 2, 3, 2]]), roots).stages[0].source == "gsm8k"


def test_model_names(tmp_path, roots):
    runs = tmp_path / "models" / "runs"
    final = runs / "r1" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    (runs / "r1" / "config.yaml").write_text("")  # (every run folder has its config)
    (runs / "r2").mkdir()
    (runs / "r2" / "config.yaml").write_text("")
    assert check_model_name("embedded", roots, runs) == ("embedded", None)
    assert check_model_name("Qwen/Qwen2.5-0.5B-Instruct", roots, runs) == ("Qwen/Qwen2.5-0.5B-Instruct", None)
    assert check_model_name("r1", roots, runs) == (str(final), None)  # a run id names its trained model
    assert "no trained model yet" in check_model_name("r2", roots, runs)[1]
    assert check_model_name(str(runs / "r1"), roots, runs) == (str(final.resolve()), None)  # a run folder: its final/
    assert "no config.json" in check_model_name(str(runs / "r2"), roots, runs)[1]
    assert "does not exist" in check_model_name(str(tmp_path / "models" / "nope"), roots, runs)[1]
    assert "outside" in check_model_name("~/.ssh", roots, runs)[1]
    assert "control characters" in check_model_name("a\x00b", roots, runs)[1]


def test_hub_model_offline_and_not_cached(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "cannot be reached" in forms.hub_model_problem("nobody-here/no-such-model-xyz")
    assert forms.hub_model_problem("embedded") is None


def test_route_errors_to_controls():
    routed = route_errors(
        [
            ("model.name", "m"),
            ("model.lora_r", "l"),
            ("stages[2].steps", "s"),
            ("grpo.prompts_per_step", "p"),
            ("data.custom_path", "u"),
            ("upload", "u2"),
            ("grpo.beta", "b"),
            ("run.name", "n"),
        ]
    )
    assert routed == {
        "model": ["m"],
        "lora": ["l"],
        "stages": ["s"],
        "prompts_per_step": ["p"],
        "upload": ["u", "u2"],
        "general": ["grpo.beta: b"],
        "run_name": ["n"],
    }
    md = forms.errors_md([("grpo.learning_rate", "bad"), ("stages[1].steps", "worse")])
    assert "Nothing was started" in md and "**Learning rate**: bad" in md and "**Stage 2**: worse" in md


def test_form_values_round_trip(roots):
    from grpo_app.core.config import config_from_dict

    cfg = config_from_dict(forms.load_preset_data(TINY))
    values = forms.form_values(cfg)
    again = build(TrainForm(preset="tiny-app", **values), roots)
    assert again.to_dict() == {**cfg.to_dict(), "run": again.to_dict()["run"]}


def test_a_preset_micro_batch_that_no_longer_divides_the_batch_is_reset_and_said(roots):
    data = forms.load_preset_data(TINY)
    data.setdefault("grpo", {})["micro_batch_size"] = 4  # sized for G = 4, 2 prompts (8 completions)
    kept = base_form(num_generations=4)
    assert build_config(kept, data, roots).grpo.micro_batch_size == 4 and kept.notes == []
    form = base_form(num_generations=3)  # 6 completions: 4 no longer divides them
    cfg = build_config(form, data, roots)
    assert cfg.grpo.micro_batch_size == 0 and cfg.micro_batch == 3
    assert any("micro-batch size 4 does not divide" in n for n in form.notes), form.notes


def test_the_form_and_the_config_share_one_bound_per_setting(roots):
    from grpo_app.core.config import GRPOSettings, field_bounds, load_config

    lo, hi = field_bounds(GRPOSettings, "num_generations")
    for g in (lo - 1, hi + 1):  # the form refuses what the config refuses, with the same bounds
        with pytest.raises(FormError) as e:
            build(base_form(num_generations=g), roots)
        assert any(f"use {lo} to {hi}" in m for _, m in e.value.errors)
        errs = load_config("quick", [f"grpo.num_generations={g}"], validate=False).validate
        with pytest.raises(Exception) as ce:
            errs()
        assert "grpo.num_generations" in str(ce.value)
    assert build(base_form(num_generations=hi, prompts_per_step=1), roots).grpo.num_generations == hi


def test_a_run_started_from_the_page_keeps_the_presets_forced_answer_line(roots):
    """The page has no control for grpo.force_answer_line: the preset's value must reach the run, as the
    classroom preset's measured results (docs/performance.md, 'A forced answer line') assume."""
    data = forms.load_preset_data(TINY)
    data.setdefault("grpo", {})["force_answer_line"] = 0.5
    assert build_config(base_form(), data, roots).grpo.force_answer_line == 0.5
    assert build(base_form(), roots).grpo.force_answer_line == 0.0  # a preset without it: off
    classroom = forms.load_preset_data(Path("configs/classroom.yaml"))
    assert classroom["grpo"]["force_answer_line"] == 0.5  # the shipped default, as measured


def test_the_stage_table_carries_per_stage_settings(roots):
    """Issue 42, goal 3: learning rate, EWC λ and replay per stage from the table; blank = the run's value."""
    cfg = build(base_form(stages=[["a", "arithmetic", 1, 1, 2, "", "", ""],
                                  ["b", "arithmetic", 2, 2, 3, "5e-5", "0", "0.25"]]), roots)
    a, b = cfg.stages
    assert (a.learning_rate, a.ewc_lam, a.replay) == (None, None, 0.0)
    assert (b.learning_rate, b.ewc_lam, b.replay) == (5e-5, 0.0, 0.25)
    from grpo_app.ui.forms import stage_rows

    assert stage_rows(cfg.stages) == [["a", "arithmetic", 1, 1, 2, "", "", ""], ["b", "arithmetic", 2, 2, 3, "5e-05", "0", "0.25"]]


@pytest.mark.parametrize(("section", "name", "field", "path"), [
    ("grpo", "max_completion_length", "max_completion_length", "grpo.max_completion_length"),
    ("grpo", "prompts_per_step", "prompts_per_step", "grpo.prompts_per_step"),
    ("ewc", "lam", "ewc_lam", "ewc.lam"),
])
def test_one_bound_per_setting_for_the_yaml_and_the_form(roots, section, name, field, path):
    """A bound is declared once, on the config field: the config's check and the form refuse the same values."""
    from grpo_app.core.config import ConfigError, EWCConfig, GRPOSettings, field_bounds, load_config

    lo, hi = field_bounds({"grpo": GRPOSettings, "ewc": EWCConfig}[section], name)
    above = hi * 2 if isinstance(hi, float) else hi + 1
    load_config("quick", [f"{path}={hi}"])  # the bound itself is allowed
    with pytest.raises(ConfigError) as e:
        load_config("quick", [f"{path}={above}"])
    assert any(p == path for p, _ in e.value.errors)
    with pytest.raises(FormError) as f:
        build(base_form(**{field: above}), roots)
    assert any(p == path for p, _ in f.value.errors)


@pytest.mark.parametrize("path", sorted(Path("configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_run_started_from_the_page_with_a_preset_trains_the_preset(roots, path):
    """A preset's measured results (docs/experiments.md) assume that a run started from the page gets the
    preset's stage options the table does not show (operators, digits, `progressive`'s carried optimizer
    moments) and its stage names. The page's config, filled from the preset and started as it is, equals the file's."""
    from grpo_app.core.config import load_config

    preset = load_config(str(path))
    form = TrainForm(preset=path.stem, **forms.form_values(preset))
    cfg = build_config(form, forms.load_preset_data(path), roots, check_hub=False)
    if path.stem == "progressive":
        assert [s.carry_moments for s in cfg.stages] == [False, False, True]
    assert cfg.stages == preset.stages
    assert (cfg.grpo, cfg.ewc, cfg.rewards) == (preset.grpo, preset.ewc, preset.rewards)
