"""Each policy loss and aggregation of `[algorithm]` against a hand-computed example, and the sum over micro-batches
equal to the whole batch's loss for every aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from turnkeep.gpu_workers.policy_loss import kl_estimate, policy_loss, token_entropy, token_weights
from turnkeep.schemas.config_algorithm import AlgorithmConfig


def _loss(ratios: list[float], advantage: float, **settings) -> tuple[float, torch.Tensor]:
    """One row whose tokens have these ratios (generation logprobs 0), token-mean; the loss and d loss / d logprob."""
    algorithm = AlgorithmConfig(**settings).resolved(clip_eps=0.2, max_tokens=16)
    logprobs = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)
    mask = torch.ones_like(logprobs)
    weights = token_weights(mask, algorithm, total_rows=1, total_tokens=len(ratios))
    loss, _ = policy_loss(logprobs, torch.zeros_like(logprobs), torch.tensor([advantage]), mask, weights, algorithm)
    loss.backward()
    return loss.item(), logprobs.grad[0]


def test_ppo_clip_symmetric_and_clip_higher() -> None:
    assert _loss([1.5, 0.5], 1.0)[0] == pytest.approx((-1.2 - 0.5) / 2)  # min(r A, clip(r) A) per token
    assert _loss([1.5, 0.5], 1.0, clip_high=0.28)[0] == pytest.approx((-1.28 - 0.5) / 2)  # DAPO's clip-higher


def test_dual_clip_caps_the_loss_of_a_negative_advantage() -> None:
    assert _loss([5.0, 0.5], -1.0)[0] == pytest.approx((5.0 + 0.8) / 2)
    assert _loss([5.0, 0.5], -1.0, dual_clip=3.0)[0] == pytest.approx((3.0 + 0.8) / 2)


def test_cispo_clips_the_detached_weight_and_keeps_every_tokens_gradient() -> None:
    loss, grad = _loss([1.5, 0.5], 1.0, policy_loss="cispo")
    assert loss == pytest.approx((-1.2 * math.log(1.5) - 0.5 * math.log(0.5)) / 2, rel=1e-5)
    assert grad.tolist() == pytest.approx([-1.2 / 2, -0.5 / 2])  # -min(r, 1 + eps_high) A per token, token-mean
    assert _loss([1.5, 0.5], 1.0)[1][0] == 0.0  # ppo_clip: the clipped token has none


def test_gspo_uses_one_ratio_per_sequence() -> None:
    sequence_ratio = math.exp((math.log(1.5) + math.log(0.5)) / 2)
    assert _loss([1.5, 0.5], 1.0, importance_level="sequence")[0] == pytest.approx(-sequence_ratio, rel=1e-5)


def test_aggregations_weigh_tokens_as_their_definitions_say() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])

    def weights(loss_agg: str) -> list[float]:
        algorithm = AlgorithmConfig(loss_agg=loss_agg, loss_constant=4)
        return token_weights(mask, algorithm, total_rows=2, total_tokens=3).flatten().tolist()

    assert weights("token_mean") == pytest.approx([1 / 3, 1 / 3, 0, 1 / 3, 0, 0])
    assert weights("seq_mean_token_sum") == pytest.approx([1 / 2, 1 / 2, 0, 1 / 2, 0, 0])
    assert weights("seq_mean_token_mean") == pytest.approx([1 / 4, 1 / 4, 0, 1 / 2, 0, 0])
    assert weights("constant") == pytest.approx([1 / 8, 1 / 8, 0, 1 / 8, 0, 0])  # Dr. GRPO: rows x constant


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "constant"])
def test_micro_batches_sum_to_the_whole_batch_loss(loss_agg: str) -> None:
    torch.manual_seed(0)
    algorithm = AlgorithmConfig(loss_agg=loss_agg, importance_level="sequence").resolved(0.2, 8)
    logprobs, gen = -torch.rand(4, 5), -torch.rand(4, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])

    def loss(rows: slice) -> float:
        w = token_weights(mask[rows], algorithm, total_rows=4, total_tokens=int(mask.sum()))
        return policy_loss(logprobs[rows], gen[rows], adv[rows], mask[rows], w, algorithm)[0].item()

    assert loss(slice(0, 2)) + loss(slice(2, 4)) == pytest.approx(loss(slice(0, 4)), rel=1e-6)


def test_the_entropy_bonus_lowers_the_loss_by_coef_times_the_mean_entropy() -> None:
    logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens: entropy log 4 at each position
    entropy = token_entropy(logits)
    assert entropy.flatten().tolist() == pytest.approx([math.log(4), math.log(4)])
    algorithm = AlgorithmConfig(entropy_coef=0.1).resolved(0.2, 8)
    mask, zeros = torch.ones(1, 2), torch.zeros(1, 2)
    weights = token_weights(mask, algorithm, 1, 2)
    with_bonus = policy_loss(zeros, zeros, torch.tensor([1.0]), mask, weights, algorithm, entropy)[0].item()
    without = policy_loss(zeros, zeros, torch.tensor([1.0]), mask, weights, algorithm)[0].item()
    assert with_bonus == pytest.approx(without - 0.1 * math.log(4))


def test_kl_estimators_by_hand_and_the_kl_term_added_to_each_tokens_loss() -> None:
    d = torch.tensor([0.5, -0.5, 0.0])  # log pi - log pi_ref
    assert kl_estimate(d, "k1").tolist() == pytest.approx([0.5, -0.5, 0.0])
    assert kl_estimate(d, "k2").tolist() == pytest.approx([0.125, 0.125, 0.0])
    assert kl_estimate(d, "k3").tolist() == pytest.approx([math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5, 0.0])
    algorithm = AlgorithmConfig(kl_coef=0.1).resolved(clip_eps=0.2, max_tokens=16)
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask = torch.ones_like(logprobs)
    weights = token_weights(mask, algorithm, total_rows=1, total_tokens=2)
    reference = torch.tensor([[-1.5, -1.5]])
    loss, stats = policy_loss(logprobs, logprobs.detach(), torch.tensor([1.0]), mask, weights, algorithm,
                              reference=reference)
    kl = [math.exp(-0.5) + 0.5 - 1, math.exp(0.5) - 0.5 - 1]
    assert loss.item() == pytest.approx(-1.0 + 0.1 * sum(kl) / 2)  # ratio 1: -A per token, plus beta x k3
    assert stats.kl_reference == pytest.approx(sum(kl) / 2)
    loss.backward()  # d k3 / d log pi = 1 - exp(-d)
    assert logprobs.grad[0].tolist() == pytest.approx([(-1 + 0.1 * (1 - math.exp(-0.5))) / 2,
                                                       (-1 + 0.1 * (1 - math.exp(0.5))) / 2])
