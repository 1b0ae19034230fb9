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


def test_the_overlong_punishment_grows_over_the_buffer_and_stops_at_the_penalty() -> None:
    from tests.controller.state.test_data_plane import make_row
    from turnkeep.gpu_workers.advantages import overlong_penalties
    from turnkeep.schemas.rollout import Segment

    def row(generated: int):
        return make_row("g", 0).model_copy(update={"segments": [
            Segment(kind="prompt", token_ids=[1]),
            Segment(kind="policy", token_ids=[3] * generated, logprobs=[-0.1] * generated, policy_version=0)]})

    algorithm = AlgorithmConfig(overlong_buffer=4, overlong_penalty=0.5).resolved(clip_eps=0.2, max_tokens=16)
    # L = 16, buffer 4: nothing up to 12 tokens, then 0.5 x (tokens - 12) / 4, at most 0.5.
    assert overlong_penalties([row(n) for n in (10, 12, 14, 16)], algorithm).tolist() == pytest.approx(
        [0, 0, -0.25, -0.5])
    assert overlong_penalties([row(16)], AlgorithmConfig().resolved(0.2, 16)).tolist() == [0.0]  # off by default
