"""The loss and advantage options in the form (issue 44, item 3): TRL's loss_type and scale_rewards from the
Train form to the config (bad values refused, routed to their control), and What if? showing the advantages
under each scaling: group (GRPO), batch (PPO Lite), none (Dr. GRPO)."""

import pytest

from grpo_app.core.config import LOSS_TYPES, SCALE_REWARDS
from grpo_app.training.advantages import what_if
from grpo_app.ui import render
from grpo_app.ui.forms import FormError, route_errors

from .test_forms import base_form, build, roots  # noqa: F401 - fixture
from .test_step_history import GROUP


@pytest.mark.parametrize("loss_type,scale", [("dr_grpo", "none"), ("grpo", "batch"), ("bnpo", "group")])
def test_the_forms_choices_reach_the_config(roots, loss_type, scale):
    cfg = build(base_form(loss_type=loss_type, scale_rewards=scale), roots)
    assert (cfg.grpo.loss_type, cfg.grpo.scale_rewards) == (loss_type, scale)


def test_empty_choices_keep_the_presets_and_bad_ones_are_refused(roots):
    cfg = build(base_form(loss_type="", scale_rewards=None), roots)
    assert (cfg.grpo.loss_type, cfg.grpo.scale_rewards) == ("dapo", "group")  # (the preset's)
    with pytest.raises(FormError) as e:
        build(base_form(loss_type="ppo", scale_rewards=["group"]), roots)
    routed = route_errors(e.value.errors)
    assert len(routed["loss"]) == 2
    assert "not one of " + ", ".join(LOSS_TYPES) in routed["loss"][0]
    assert "not one of " + ", ".join(SCALE_REWARDS) in routed["loss"][1]


def test_what_if_gives_the_advantages_under_every_scaling():
    r = what_if(GROUP, {"correctness": 1.0, "has_number": 0.5}, scale_rewards="none")
    assert set(r["by_scale"]) == set(SCALE_REWARDS)
    assert r["by_scale"]["none"] == pytest.approx([0.5, -0.5, -0.5, 0.5]) == r["advantages"]  # total - mean
    std = (1.0 / 3) ** 0.5
    a = 0.5 / (std + 1e-4)
    assert r["by_scale"]["group"] == pytest.approx([a, -a, -a, a], rel=1e-6)
    assert r["by_scale"]["batch"] == pytest.approx(r["by_scale"]["group"], rel=1e-6)  # one group: the same std
    # a group whose totals barely differ: scaling blows a 0.01 gap up to ~±0.87, Dr. GRPO keeps it ±0.005
    close = dict(GROUP, rewards={"correctness": [1.0, 1.0, 1.0, 1.0], "has_number": [1.0, 0.98, 1.0, 0.98]})
    c = what_if(close, {"correctness": 1.0, "has_number": 1.0})
    assert abs(c["by_scale"]["group"][0]) > 0.8 and abs(c["by_scale"]["none"][0]) < 0.01
    html = render.scalings_html(c)
    assert html.count("<tr>") == 1 + 3 and "Dr. GRPO" in html  # the head and a row per scaling and html.count("(this run)") == 1
    assert "group: ÷ the group" in html.split("(this run)")[0]  # the run's scaling is the one marked
