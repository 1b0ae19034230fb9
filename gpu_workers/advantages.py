"""Advantage estimators of `[algorithm]` (docs/algorithms.md): one advantage per row, from the step's rewards and
its prompt groups."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from turnkeep.schemas.config_algorithm import AlgorithmConfig
from turnkeep.schemas.rollout import RolloutRow

EPS = 1e-6


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
        if algorithm.advantage == "rloo":
            baseline = (group.sum() - group) / (len(indices) - 1)
        else:
            baseline = group.mean()
        advantages[index] = group - baseline
        if algorithm.scale_rewards == "group":
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
