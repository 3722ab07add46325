"""GRPO advantages as TRL computes them, and the what-if recompute of one recorded group.

TRL 1.16 (`GRPOTrainer._generate_and_score_completions`, the default "sum_then_normalize"):
  total_i   = sum_k w_k * r_ik                  float32; a NaN reward counts 0 (`nansum`)
  mean      = the group's mean total
  std       = sample std (n - 1) of the group's totals (scale_rewards "group" or "none"),
              or of every total of the generation batch ("batch")
  advantage = total_i - mean, divided by (std + 1e-4) unless scale_rewards is "none"
`group_advantages` does the same operations in float32 torch, so with a run's own weights it gives the
advantages the run recorded (tests/test_step_history.py checks it against a trained step and TRL's `nanstd`),
including the trainer's one change to them (departure 4): a group whose totals are all equal gets exactly 0,
where TRL's float32 mean and std leave about +-1e-3 (the totals are compared in float64).

`what_if` is the classroom tool of "Inside a GRPO step": change the reward weights (a reward the run did not
use is scored now from the completion's text) or keep only the first n completions, and see the totals,
the group's mean and std and the advantages again. Nothing is trained and no model runs.
"""

from __future__ import annotations

import math

import torch

STD_EPS = 1e-4  # TRL's: advantages / (std + 1e-4)
SCALE_REWARDS = ("group", "batch", "none")


def _nanstd(t: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """TRL's `trl.trainer.utils.nanstd` (Bessel-corrected std ignoring NaNs; NaN for fewer than 2 values)."""
    mean = torch.nanmean(t, dim=dim, keepdim=True)
    variance = torch.nanmean((t - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(t), dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(count, float("nan"), dtype=t.dtype))
    std = torch.sqrt(variance * correction)
    return std.squeeze() if dim is None else std.squeeze(dim)


def equal_groups(rewards: dict[str, list[float]], weights: dict[str, float], size: int) -> list[bool]:
    """Departure 4: for each group of `size` consecutive rows, whether every row earned the same total. `rewards`:
    {function name: [reward per row]}; totals in float64 (a NaN reward counts 0, as TRL's nansum), equal to 1e-9,
    so float32 residue in TRL's mean cannot hide an equal group."""
    names = [n for n in rewards if n in weights]
    rows = len(rewards[names[0]]) if names else 0
    totals = [sum(float(weights[n]) * rewards[n][i] for n in names if rewards[n][i] == rewards[n][i]) for i in range(rows)]
    return [max(totals[s : s + size]) - min(totals[s : s + size]) <= 1e-9 for s in range(0, rows, size)]


def group_advantages(
    rewards: dict[str, list[list[float]]], weights: dict[str, float], scale_rewards: str = "group"
) -> dict:
    """Advantages of whole groups as TRL computes them.

    rewards: {function name: [[r for each completion] for each group]}, all groups of the same size G.
    Returns float lists per group: 'totals', 'advantages', and per group 'mean' and 'std'."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)} (got {scale_rewards!r}).")
    names = [n for n in rewards if n in weights]
    if not names:
        raise ValueError("no reward function has a weight.")
    n_groups = len(rewards[names[0]])
    size = len(rewards[names[0]][0]) if n_groups else 0
    if (
        size < 1
        or any(len(g) != size for n in names for g in rewards[n])
        or any(len(rewards[n]) != n_groups for n in names)
    ):
        raise ValueError("every group needs the same number of completions (at least 1).")
    per_func = torch.tensor(
        [[rewards[n][gi][i] for n in names] for gi in range(n_groups) for i in range(size)], dtype=torch.float32
    )
    w = torch.tensor([float(weights[n]) for n in names], dtype=torch.float32)
    totals = (per_func * w.unsqueeze(0)).nansum(dim=1)
    mean = torch.nanmean(totals.view(-1, size), dim=1).repeat_interleave(size, dim=0)
    if scale_rewards in ("group", "none"):
        std = (
            _nanstd(totals.view(-1, size), dim=1).repeat_interleave(size, dim=0)
            if size > 1
            else torch.zeros_like(totals)
        )
    else:
        std = _nanstd(totals).expand_as(totals) if totals.numel() > 1 else torch.zeros_like(totals)
    adv = totals - mean
    if scale_rewards != "none":
        adv = adv / (std + STD_EPS)
    adv = torch.nan_to_num(adv, nan=0.0)
    flat = equal_groups({n: [v for g in rewards[n] for v in g] for n in names}, weights, size) if size else []
    for g, equal in enumerate(flat):  # departure 4: equal totals teach nothing, and get exactly 0
        if equal:
            adv[g * size : (g + 1) * size] = 0.0

    def groups(t):
        return [t[g * size : (g + 1) * size].tolist() for g in range(n_groups)]

    return {
        "totals": groups(totals),
        "advantages": groups(adv),
        "mean": [float(mean[g * size]) for g in range(n_groups)],
        "std": [_finite(float(std[g * size])) for g in range(n_groups)],
    }


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _scores(group: dict, name: str, n: int) -> tuple[list[float], bool]:
    """The first n scores of reward `name` for this group: recorded, or computed now from the text."""
    recorded = (group.get("rewards") or {}).get(name)
    if recorded is not None:
        return [float(v) for v in recorded[:n]], False
    from grpo_app.core.rewards import REWARD_FUNCS, reward_columns

    fn = REWARD_FUNCS.get(name)
    if fn is None:
        raise ValueError(f"unknown reward function '{name}'.")
    comps = list(group.get("completions") or [])[:n]
    columns = reward_columns(len(comps), str(group.get("answer", "")), group.get("question"), group.get("difficulty"))
    vals = fn([""] * len(comps), comps, **columns)
    return [float(v) for v in vals], True


def what_if(
    group: dict,
    weights: dict[str, float],
    group_size: int | None = None,
    scale_rewards: str = "group",
    batch_groups: list[dict] | None = None,
) -> dict:
    """One recorded group (a `latest_step.json` group) recomputed with other reward weights and/or only its
    first `group_size` completions: a group dict like the recorded one (question, answer, completions,
    rewards, totals, mean, std, advantages) plus 'weights', 'group_size', 'scale_rewards', 'by_scale' (the
    advantages under each of group / batch / none) and 'computed' (rewards scored now from the text because
    the run did not use them).

    Weights of 0 drop a reward. With scale_rewards "batch" the std is over `batch_groups` (every group of the
    step, this one included, each cut to `group_size`); without them, over this group alone."""
    comps = list(group.get("completions") or [])
    g = len(comps)
    if g < 1:
        raise ValueError("the group has no completions.")
    n = g if group_size is None else int(group_size)
    if not 1 <= n <= g:
        raise ValueError(f"group size must be between 1 and {g} (the completions this group has).")
    active = {k: float(v) for k, v in weights.items() if float(v) != 0.0}
    if not active:
        active = {next(iter(weights), "correctness"): 0.0}  # every total is 0: no signal, shown as such
    rewards, computed = {}, []
    for name in active:
        rewards[name], now = _scores(group, name, n)
        if now:
            computed.append(name)
    others = [group] if scale_rewards != "batch" or not batch_groups else batch_groups
    idx = next((i for i, o in enumerate(others) if o is group), None)
    if idx is None:
        others, idx = [group, *others], 0
    table = {name: [rewards[name] if o is group else _scores(o, name, n)[0] for o in others] for name in active}
    if any(len(o.get("completions") or []) < n for o in others):
        raise ValueError("every group of the step needs at least group-size completions.")
    res = group_advantages(table, active, scale_rewards)
    # the same totals under each of TRL's scalings (group: GRPO; batch: PPO Lite; none: Dr. GRPO), so a class
    # sees what dividing by the std does to a group whose rewards barely differ
    by_scale = {s: res["advantages"][idx] if s == scale_rewards else group_advantages(table, active, s)["advantages"][idx]
                for s in SCALE_REWARDS}
    return {
        "question": group.get("question", ""),
        "answer": group.get("answer", ""),
        "completions": comps[:n],
        "rewards": rewards,
        "totals": res["totals"][idx],
        "mean": res["mean"][idx],
        "std": res["std"][idx],
        "advantages": res["advantages"][idx],
        "weights": active,
        "group_size": n,
        "scale_rewards": scale_rewards,
        "by_scale": by_scale,
        "computed": computed,
    }
