"""What Start would run, shown before it runs (no Gradio import): the run's config.yaml and the equivalent
`python -m grpo_app train` command — the preset plus `--set` overrides for every setting the form changed.

The command is built from the difference between the preset's config and the form's config, so loading it
with the CLI gives the same config (tests/test_preview.py parses the shown command with the CLI's own parser).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from grpo_app.core.config import PROJECT_ROOT, Config, config_from_dict


def _yaml_value(value) -> str:
    """`value` as the text after 'key=' that yaml.safe_load reads back as the same value."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")].strip()
    return text


def config_overrides(base: Config, cfg: Config) -> list[str]:
    """`key=value` overrides that turn `base` into `cfg` (stages one field at a time when their number is
    the same, else the whole list)."""
    a, b = base.to_dict(), cfg.to_dict()
    out: list[str] = []
    for key, value in b.items():
        if key == "stages":
            old = a.get("stages") or []
            if len(old) == len(value):
                for k, (s0, s1) in enumerate(zip(old, value)):
                    out += [f"stages[{k}].{f}={_yaml_value(v)}" for f, v in s1.items() if s0.get(f) != v]
            else:
                out.append(f"stages={_yaml_value(value)}")
        elif isinstance(value, dict):
            old = a.get(key) or {}
            out += [f"{key}.{f}={_yaml_value(v)}" for f, v in value.items() if old.get(f) != v]
        elif a.get(key) != value:
            out.append(f"{key}={_yaml_value(value)}")
    return out


def config_ref(preset_path: Path) -> str:
    """How the CLI names a preset file: its name when it is one of configs/, else its path (relative to the
    project when inside it, as the CLI runs from there)."""
    from grpo_app.core.config import CONFIG_DIR

    p = Path(preset_path).resolve()
    if p.parent == CONFIG_DIR.resolve():
        return p.stem
    try:
        return str(p.relative_to(PROJECT_ROOT))
    except ValueError:
        return str(p)


def train_command(preset_path: Path, preset_data: dict, cfg: Config) -> str:
    """`python -m grpo_app train --config <preset> --set ...` that builds `cfg`."""
    base = config_from_dict(preset_data)
    parts = ["python -m grpo_app train", "--config", shlex.quote(config_ref(preset_path))]
    for o in config_overrides(base, cfg):
        parts += ["--set", shlex.quote(o)]
    return " \\\n    ".join([" ".join(parts[:3])] + [f"--set {parts[i + 1]}" for i in range(3, len(parts), 2)])


def preview(studio, form, upload=None) -> tuple[str, str]:
    """(config.yaml, command) for the Train form exactly as Start would build it; raises forms.FormError."""
    from grpo_app.ui import forms

    data = studio.train.preset_data(form.preset)
    if upload:
        form.custom_path, _ = studio.train.check_upload(upload)
    cfg = forms.build_config(form, data, studio.model_roots(), studio.manager.root)
    return cfg.to_yaml(), train_command(studio.presets[form.preset], data, cfg)
