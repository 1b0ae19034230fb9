"""Each advantage estimator of `[algorithm]` against a hand-computed example."""

from __future__ import annotations

import math

import pytest
import torch

from turnkeep.gpu_workers.advantages import row_advantages
from turnkeep.schemas.config_algorithm import AlgorithmConfig

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
GROUPS = {"a": [0, 1, 2, 3], "b": [4, 5]}


def _advantages(**settings) -> list[float]:
    return row_advantages(REWARDS, GROUPS, AlgorithmConfig(**settings)).tolist()


def test_rloo_subtracts_the_mean_of_the_others() -> None:
    # 1 against (0 + 0 + 1) / 3, 0 against (1 + 0 + 1) / 3; a unanimous group has no advantage.
    assert _advantages() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0])


def test_grpo_subtracts_the_group_mean_scaled_by_the_group_or_batch_std_or_not() -> None:
    assert _advantages(advantage="grpo") == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0])
    group_std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    assert _advantages(advantage="grpo", scale_rewards="group") == pytest.approx(
        [0.5 / group_std, -0.5 / group_std, -0.5 / group_std, 0.5 / group_std, 0, 0], rel=1e-5)
    batch_std = math.sqrt((4 / 9 + 2 * 4 / 9) / 5)  # unbiased std of the six rewards (mean 2/3)
    assert _advantages(advantage="grpo", scale_rewards="batch") == pytest.approx(
        [0.5 / batch_std, -0.5 / batch_std, -0.5 / batch_std, 0.5 / batch_std, 0, 0], rel=1e-5)


def test_reinforce_pp_whitens_over_the_batch_without_a_group_baseline() -> None:
    mean, std = 2 / 3, math.sqrt((4 / 9 + 2 * 4 / 9) / 5)
    expected = [(r - mean) / std for r in REWARDS.tolist()]
    assert _advantages(advantage="reinforce_pp") == pytest.approx(expected, rel=1e-5)
