"""Advantage estimators of `[algorithm]` (docs/algorithms.md): one advantage per row, from the step's rewards and
its prompt groups."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from turnkeep.schemas.config_algorithm import AlgorithmConfig
from turnkeep.schemas.rollout import RolloutRow

EPS = 1e-6


def leave_one_out_advantages(
    rewards: torch.Tensor, *, scale_by_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Leave-one-out advantages along the last dim: A_i = r_i - mean_{j != i} r_j.

    `rewards` is one group of shape [N] (or any [..., N], each last-dim slice a
    group). With `scale_by_std`, advantages are divided by the group's reward std
    plus `eps` (off by default; see gpu_workers/grpo.py's docstring).
    """
    if rewards.dim() == 0:
        raise ValueError("rewards must have a group dimension, got a scalar")
    n = rewards.shape[-1]
    if n < 2:
        raise ValueError(f"a leave-one-out baseline needs at least 2 rewards per group, got {n}")
    r = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    others_mean = (r.sum(dim=-1, keepdim=True) - r) / (n - 1)
    advantages = r - others_mean
    if scale_by_std:
        advantages = advantages / (r.std(dim=-1, keepdim=True) + eps)
    return advantages


def batched_leave_one_out_advantages(
    rewards: torch.Tensor, *, scale_by_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Leave-one-out advantages for G groups of N rewards each: [G, N] -> [G, N]."""
    if rewards.dim() != 2:
        raise ValueError(f"expected rewards of shape [G, N], got {tuple(rewards.shape)}")
    return leave_one_out_advantages(rewards, scale_by_std=scale_by_std, eps=eps)


def row_advantages(rewards: torch.Tensor, groups: dict[str, list[int]], algorithm: AlgorithmConfig) -> torch.Tensor:
    """`rewards` [B]; `groups`: each group's row indices (at least two each)."""
    r = rewards.to(torch.float32)
    if algorithm.advantage == "reinforce_pp":
        # REINFORCE++: the batch mean as the baseline and the batch std as the scale, no group baseline.
        return (r - r.mean()) / (_std(r) + EPS)
    advantages = torch.zeros_like(r)
    for indices in groups.values():
        index = torch.tensor(indices)
        group = r[index]
        by_group_std = algorithm.scale_rewards == "group"
        if algorithm.advantage == "rloo":
            advantages[index] = leave_one_out_advantages(group, scale_by_std=by_group_std, eps=EPS)
            continue
        advantages[index] = group - group.mean()
        if by_group_std:
            advantages[index] = advantages[index] / (_std(group) + EPS)
    if algorithm.scale_rewards == "batch":
        advantages = advantages / (_std(r) + EPS)
    return advantages


def overlong_penalties(rows: Sequence[RolloutRow], algorithm: AlgorithmConfig) -> torch.Tensor:
    """DAPO's soft overlong punishment of each row (0 when off or within L - buffer tokens): minus the penalty times
    the share of the buffer the row used, L = `algorithm.max_tokens`."""
    penalties = torch.zeros(len(rows), dtype=torch.float32)
    buffer, longest = algorithm.overlong_buffer, algorithm.max_tokens
    if buffer is None or longest is None:
        return penalties
    for i, row in enumerate(rows):
        over = row.generated_tokens() - (longest - buffer)
        if over > 0:
            penalties[i] = -algorithm.overlong_penalty * min(over / buffer, 1.0)
    return penalties


def _std(values: torch.Tensor) -> torch.Tensor:
    """The unbiased std (0 for a single value), as TRL and verl scale by."""
    return values.std() if values.numel() > 1 else torch.zeros(())
