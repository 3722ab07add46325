import re

import pytest

from grpo_app.core.config import (
    Config,
    ConfigError,
    config_from_dict,
    list_presets,
    load_config,
    load_yaml_text,
    parse_override,
)


def errors_of(overrides, base="quick"):
    with pytest.raises(ConfigError) as ei:
        load_config(base, overrides)
    return ei.value.errors


def test_every_preset_loads_and_validates():
    names = list_presets()
    assert {"quick", "classroom"} <= set(names)
    for name in names:
        cfg = load_config(name)
        assert cfg.stages and cfg.total_steps > 0


@pytest.mark.parametrize(
    "override, field, words",
    [
        ("grpo.num_generations=1", "grpo.num_generations", "at least 2"),  # G < 2
        ("grpo.learning_rate=0", "grpo.learning_rate", "> 0"),  # lr <= 0
        ("grpo.learning_rate=-1e-5", "grpo.learning_rate", "> 0"),
        ("grpo.micro_batch_size=3", "grpo.micro_batch_size", "divisible"),  # 16 % 3
        ("grpo.temperature=0", "grpo.temperature", "sampling"),
        ("grpo.loss_type=ppo", "grpo.loss_type", "not one of"),
        ("grpo.optimizer=sgd", "grpo.optimizer", "not one of"),
        ("ewc.lam=-1", "ewc.lam", "0 or more"),
        ("ewc.fisher_source=magic", "ewc.fisher_source", "not one of"),
        ("stages[0].steps=0", "stages[0].steps", "at least 1"),
        ("stages[0].max_difficulty=0", "stages[0].max_difficulty", "below min_difficulty"),
        ("stages[0].source=wiki", "stages[0].source", "not one of"),
        ("stages[0].operators=+x", "stages[0].operators", "+ - * /"),
        ("run.name=../etc", "run.name", "letters"),
        ("run.keep_checkpoints=0", "run.keep_checkpoints", "resume"),
        ("model.name=not a model", "model.name", "neither"),
        ("data.gsm8k=sometimes", "data.gsm8k", "not one of"),
        ("model.trainable_layers=-1", "model.trainable_layers", "number of top layers"),
    ],
)
def test_invalid_values_name_the_field_and_the_fix(override, field, words):
    errs = errors_of([override])
    assert any(path == field and words in msg for path, msg in errs), errs


def test_unknown_reward_suggests_the_close_name():
    errs = errors_of(["rewards.weights={correctnes: 1.0}"])
    assert any("unknown reward 'correctnes'" in m and "correctness" in m for _, m in errs)


def test_unknown_yaml_key_is_rejected_with_suggestion():
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"grpo": {"num_generatons": 4}})
    (path, msg), = ei.value.errors
    assert path == "grpo.num_generatons" and "num_generations" in msg
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"optimiser": {}})
    assert ei.value.errors[0][0] == "optimiser"


def test_wrong_types_are_reported_not_coerced_silently():
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"grpo": {"num_generations": "eight"}, "ewc": {"enabled": "maybe"}})
    paths = [p for p, _ in ei.value.errors]
    assert "grpo.num_generations" in paths and "ewc.enabled" in paths


def test_bf16_on_cpu_without_support_is_rejected(monkeypatch):
    import grpo_app.core.config as c

    monkeypatch.setattr(c, "cpu_supports_bf16", lambda: False)
    errs = errors_of(["model.dtype=bfloat16", "model.device=cpu"])
    assert any(p == "model.dtype" and "float32" in m for p, m in errs)


def test_overrides_and_lambda_alias():
    cfg = load_config("quick", ["grpo.num_generations=4", "stages[1].steps=5", "ewc.lambda=7.5"])
    assert cfg.grpo.num_generations == 4 and cfg.stages[1].steps == 5 and cfg.ewc.lam == 7.5
    assert parse_override("stages[0].name=warmup") == (["stages", 0, "name"], "warmup")
    with pytest.raises(ConfigError):
        parse_override("no-equals-sign")
    with pytest.raises(ConfigError):
        load_config("quick", ["stages[9].steps=1"])


def test_several_errors_are_reported_together():
    errs = errors_of(["grpo.num_generations=1", "grpo.learning_rate=0"])
    assert {"grpo.num_generations", "grpo.learning_rate"} <= {p for p, _ in errs}


def test_yaml_roundtrip():
    cfg = load_config("quick")
    again = config_from_dict(__import__("yaml").safe_load(cfg.to_yaml()))
    assert again.to_dict() == cfg.to_dict()
    assert isinstance(again, Config)


def test_invalid_yaml_text_gives_line_number(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("grpo:\n  num_generations: [4\n")
    with pytest.raises(ConfigError) as ei:
        load_config(str(p))
    assert "line" in str(ei.value)


def test_each_section_checks_itself_and_collect_errors_adds_the_path():
    from grpo_app.core.config import Config, EWCConfig, GRPOSettings, StageConfig, collect_errors

    cfg = Config()
    assert EWCConfig(lam=-1).check(cfg) == [("lam", "lambda must be 0 or more, at most 1e+09 (got -1).")]
    assert [f for f, _ in GRPOSettings(num_generations=1, top_p=0).check(cfg)] == ["num_generations", "top_p"]
    cfg.stages = [StageConfig(source="arithmetic", steps=3), StageConfig(steps=0)]
    cfg.ewc.lam = -1
    paths = [p for p, _ in collect_errors(cfg)]
    assert paths == ["ewc.lam", "stages[1].steps"]


def test_error_messages_never_carry_a_whole_long_value():
    errs = errors_of(["grpo.loss_type=" + "x" * 5000, "model.dtype=" + "y" * 5000])
    assert errs and all(len(m) < 300 for _, m in errs), [len(m) for _, m in errs]


def test_fit_micro_batch_resets_only_a_size_that_no_longer_divides():
    from grpo_app.core.config import GRPOSettings

    g = GRPOSettings(num_generations=4, prompts_per_step=2, micro_batch_size=4)
    assert g.fit_micro_batch() is None and g.micro_batch_size == 4
    g.num_generations = 5  # 10 completions: 4 no longer divides them
    assert "does not divide" in g.fit_micro_batch() and g.micro_batch_size == 0


# ---- YAML with limits ---------------------------------------------------------------------------------------
def _billion_laughs(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    import time

    p = tmp_path / "bomb.yaml"
    p.write_text(_billion_laughs())  # 9**9 = 387 million strings once expanded
    t = time.perf_counter()
    with pytest.raises(ConfigError, match="aliases .* are not allowed"):
        load_config(str(p))
    assert time.perf_counter() - t < 2.0


@pytest.mark.parametrize(
    "text, words",
    [
        ("a: &x 1\nb: *x\n", "aliases"),  # one harmless alias: configs never need them, so none is taken
        ("base: &b {steps: 2}\nstages: [{<<: *b, name: s}]\n", "aliases"),  # a merge key is an alias too
        ("a: &x [*x]\n", "aliases"),  # a recursive alias
        ("a: " + "[" * 40 + "]" * 40 + "\n", "nested more than"),  # libyaml's time grows with the square of this
        ("a: !!python/object/apply:os.system [ls]\n", "tag that is not allowed"),  # code, refused by the safe loader
        ("a: !custom 1\n", "tag that is not allowed"),
        ("a: " + "9" * 5000 + "\n", "cannot be read"),  # past Python's 4300-digit integer limit
        ("{[1]: 2}\n", "not valid YAML|cannot be read"),  # an unhashable key
    ],
)
def test_yaml_that_is_refused(text, words):
    with pytest.raises(ConfigError) as ei:
        load_yaml_text(text, "f.yaml")
    assert re.search(words, str(ei.value)) and len(str(ei.value)) < 400


def test_an_oversize_config_is_refused_before_it_is_read(tmp_path):
    import time

    p = tmp_path / "big.yaml"
    p.write_text("model:\n  name: embedded\n" + "# padding\n" * 30_000)  # ~300 KB
    t = time.perf_counter()
    with pytest.raises(ConfigError, match="KB limit"):
        load_config(str(p))
    with pytest.raises(ConfigError, match="KB limit"):
        load_yaml_text(p.read_text())
    assert time.perf_counter() - t < 1.0


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\xff\xfe\x00grpo: 1", "not UTF-8"),  # bytes that are not text
        (None, "is a folder"),  # a directory named like a config
    ],
)
def test_unreadable_config_files(tmp_path, content, words):
    p = tmp_path / "c.yaml"
    if content is None:
        p.mkdir()
    else:
        p.write_bytes(content)
    with pytest.raises(ConfigError, match=words):
        load_config(str(p))


def test_a_long_value_is_cut_in_its_error_message():
    with pytest.raises(ConfigError) as ei:
        load_config("quick", ["grpo.num_generations=" + "x" * 100_000])
    assert "xxx..." in str(ei.value) and len(str(ei.value)) < 300
    with pytest.raises(ConfigError) as ei:
        load_config("quick", ["grpo." + "k" * 100_000 + "=1"])
    assert len(str(ei.value)) < 600


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.name.x=1", "'model.name' is a value"),  # a path that goes through a scalar
        ("stages[0].steps.a=1", "'stages\\[0\\].steps' is a value"),
        ("stages.x=1", "'stages' is a list"),
        ("model[0].name=x", "'model' is not a list"),
        ("grpo.learning_rate=[1", "not valid YAML"),  # not YAML
        ("model.name=!!python/name:os.system", "tag that is not allowed"),  # a tag
    ],
)
def test_overrides_that_cannot_apply(override, words):
    with pytest.raises(ConfigError, match=words):
        load_config("quick", [override])


@pytest.mark.parametrize(
    "override",
    [
        "ewc.lam=.inf",  # YAML's infinity
        "ewc.lam=.nan",  # and NaN: a float setting never needs either
        "grpo.learning_rate=1e999",  # text that float() reads as inf
        "grpo.temperature=-.inf",
    ],
)
def test_float_settings_must_be_finite(override):
    with pytest.raises(ConfigError, match="finite number"):
        load_config("quick", [override])


@pytest.mark.parametrize("override", ["run.seed=-1", "run.seed=99999999999999999999", "data.seed=4294967296"])
def test_seeds_out_of_range_are_refused_before_any_model_loads(override):
    errs = errors_of([override])
    assert any(p == override.split("=")[0] and "between 0 and 2147483647" in m for p, m in errs), errs


def test_per_stage_settings_default_to_the_run_and_are_checked():
    """Issue 42, goal 3: a stage's learning rate, EWC λ and reward weights; empty = the run's value."""
    from grpo_app.core.config import ConfigError, load_config
    from grpo_app.training.settings import grpo_args, stage_reward_weights

    cfg = load_config("tests/configs/tiny.yaml", ["stages[1].learning_rate=5e-5", "stages[1].ewc_lam=0",
                                                   "stages[1].reward_weights={correctness: 2.0}",
                                                   "stages[0].learning_rate="])
    assert cfg.stages[0].learning_rate is None and cfg.stages[1].learning_rate == 5e-5
    assert cfg.stages[0].ewc_lam is None and cfg.stages[1].ewc_lam == 0.0
    assert grpo_args(cfg, 0, "/tmp/x", "cpu").learning_rate == cfg.grpo.learning_rate
    assert grpo_args(cfg, 1, "/tmp/x", "cpu").learning_rate == 5e-5
    names = list(cfg.rewards.weights)  # correctness, has_number
    assert stage_reward_weights(cfg, 0, names) == [1.0, 1.0] and stage_reward_weights(cfg, 1, names) == [2.0, 1.0]
    again = load_config("tests/configs/tiny.yaml", [])  # the YAML round trip keeps them (null = the run's)
    assert again.stages[0].learning_rate is None
    back = load_config_text(cfg.to_yaml())
    assert back.stages[1].learning_rate == 5e-5 and back.stages[0].ewc_lam is None
    assert back.stages[1].reward_weights == {"correctness": 2.0}
    for override, field_path, words in (
        ("stages[1].learning_rate=2", "stages[1].learning_rate", "must lie in"),
        ("stages[1].ewc_lam=-1", "stages[1].ewc_lam", "must lie in"),
        ("stages[1].reward_weights={brevity: 1}", "stages[1].reward_weights", "is not among rewards.weights"),
        ("stages[1].learning_rate=fast", "stages[1].learning_rate", "expected a number"),
    ):
        with pytest.raises(ConfigError) as err:
            load_config("tests/configs/tiny.yaml", [override])
        assert any(p == field_path and words in m for p, m in err.value.errors), err.value.errors


def load_config_text(text):
    import yaml

    from grpo_app.core.config import config_from_dict

    return config_from_dict(yaml.safe_load(text))

