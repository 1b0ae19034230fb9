"""GRPO math: leave-one-out advantages, the clipped loss, logprobs and batch packing."""

from __future__ import annotations

import math

import pytest
import torch

from turnkeep.gpu_workers.grpo import (
    batched_leave_one_out_advantages,
    build_batch,
    clipped_policy_loss,
    leave_one_out_advantages,
    token_logprobs,
)
from turnkeep.schemas.rollout import RolloutRow, Segment


def row(group: str, sibling: int, reward: float, segments: list[Segment]) -> RolloutRow:
    return RolloutRow(
        group_id=group,
        sibling=sibling,
        attempt=0,
        segments=segments,
        reward=reward,
        num_turns=sum(s.kind == "policy" for s in segments),
    )


def policy(ids: list[int], logprobs: list[float]) -> Segment:
    return Segment(kind="policy", token_ids=ids, logprobs=logprobs, policy_version=0)


def test_leave_one_out_on_a_hand_example() -> None:
    adv = leave_one_out_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert torch.allclose(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


def test_leave_one_out_sums_to_zero_and_batches() -> None:
    rewards = torch.rand(5, 8, generator=torch.Generator().manual_seed(0))
    adv = batched_leave_one_out_advantages(rewards)
    assert torch.allclose(adv.sum(dim=-1), torch.zeros(5), atol=1e-6)
    for g in range(5):
        assert torch.allclose(adv[g], leave_one_out_advantages(rewards[g]))
    # Unanimous groups carry no signal.
    assert torch.equal(leave_one_out_advantages(torch.ones(4)), torch.zeros(4))


def test_leave_one_out_needs_two_rewards_and_std_scaling_is_optional() -> None:
    with pytest.raises(ValueError):
        leave_one_out_advantages(torch.tensor([1.0]))
    with pytest.raises(ValueError):
        batched_leave_one_out_advantages(torch.tensor([1.0, 0.0]))
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    plain = leave_one_out_advantages(r)
    scaled = leave_one_out_advantages(r, scale_by_std=True)
    assert torch.allclose(scaled, plain / (r.std() + 1e-6))


def test_loss_at_ratio_one_is_minus_the_token_mean_advantage() -> None:
    gen = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -0.1]])
    logprobs = gen.clone().requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([0.5, -1.0])
    loss, stats = clipped_policy_loss(logprobs, gen, adv, mask, clip_eps=0.2)
    expected = -(0.5 * 2 + -1.0 * 3) / 5
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    # d/dlogprob of ratio*A at ratio 1 is A; spread over the token mean.
    expected_grad = -(adv.unsqueeze(-1) * mask) / 5
    assert torch.allclose(logprobs.grad, expected_grad)
    assert stats.num_tokens == 5
    assert stats.mean_ratio == pytest.approx(1.0)
    assert stats.approx_kl == pytest.approx(0.0)
    assert stats.clip_fraction == 0.0


def test_clipping_zeroes_the_gradient_above_one_plus_eps_for_positive_advantages() -> None:
    gen = torch.zeros(1, 2)
    # ratio 1.5 on the first token (clipped for A > 0), 1.1 on the second (inside the clip).
    logprobs = torch.tensor([[math.log(1.5), math.log(1.1)]], requires_grad=True)
    loss, stats = clipped_policy_loss(logprobs, gen, torch.tensor([2.0]), torch.ones(1, 2), 0.2)
    assert loss.item() == pytest.approx(-(1.2 * 2 + 1.1 * 2) / 2)
    loss.backward()
    assert logprobs.grad[0, 0].item() == 0.0
    assert logprobs.grad[0, 1].item() == pytest.approx(-1.1 * 2 / 2)
    assert stats.clip_fraction == pytest.approx(0.5)


def test_negative_advantage_is_not_clipped_above_one_plus_eps() -> None:
    # The min keeps the more pessimistic unclipped term, so the gradient still pushes down.
    logprobs = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, stats = clipped_policy_loss(logprobs, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), 0.2)
    assert loss.item() == pytest.approx(1.5)
    loss.backward()
    assert logprobs.grad.item() == pytest.approx(1.5)
    assert stats.clip_fraction == 0.0


def test_masked_tokens_do_not_affect_loss_or_gradient() -> None:
    gen = torch.tensor([[-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    a = torch.tensor([[-0.9, -1.0, -float("inf")]], requires_grad=True)
    b = torch.tensor([[-0.9, -5.0, -3.0]], requires_grad=True)
    loss_a, _ = clipped_policy_loss(a, gen, torch.tensor([1.0]), mask, 0.2)
    loss_b, _ = clipped_policy_loss(b, gen, torch.tensor([1.0]), mask, 0.2)
    assert loss_a.item() == pytest.approx(loss_b.item())
    loss_a.backward()
    assert torch.isfinite(a.grad).all()
    assert a.grad[0, 1:].abs().sum().item() == 0.0


def test_num_tokens_overrides_the_denominator_for_micro_batches() -> None:
    gen = torch.zeros(1, 2)
    loss, _ = clipped_policy_loss(gen.clone(), gen, torch.tensor([1.0]), torch.ones(1, 2), 0.2, num_tokens=8)
    assert loss.item() == pytest.approx(-2 / 8)


def test_token_logprobs_are_shifted_next_token_logprobs() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    got = token_logprobs(logits, ids)
    assert got.shape == (2, 4)
    full = torch.log_softmax(logits, dim=-1)
    for b in range(2):
        for t in range(4):
            assert got[b, t].item() == pytest.approx(full[b, t, ids[b, t + 1]].item(), abs=1e-5)
    hot = token_logprobs(logits, ids, temperature=0.5)
    assert hot[0, 0].item() == pytest.approx(torch.log_softmax(logits[0, 0] / 0.5, -1)[ids[0, 1]].item(), abs=1e-5)


def test_build_batch_aligns_policy_tokens_to_the_position_before_them() -> None:
    first = row("g1", 0, 1.0, [
        Segment(kind="prompt", token_ids=[5, 6]),
        policy([7, 8], [-0.1, -0.2]),
        Segment(kind="tool", token_ids=[9]),
        policy([10], [-0.3]),
    ])
    second = row("g1", 1, 0.0, [Segment(kind="prompt", token_ids=[5]), policy([11], [-0.4])])
    other_a = row("g2", 0, 0.0, [Segment(kind="prompt", token_ids=[1, 2]), policy([3], [-0.5])])
    other_b = row("g2", 1, 0.0, [Segment(kind="prompt", token_ids=[1, 2]), policy([4], [-0.6])])
    batch = build_batch([first, other_a, second, other_b], pad_id=0)

    assert batch.input_ids.tolist()[0] == [5, 6, 7, 8, 9, 10]
    assert batch.input_ids.tolist()[2] == [5, 11, 0, 0, 0, 0]
    assert batch.attention_mask.tolist()[2] == [1, 1, 0, 0, 0, 0]
    # Position t predicts input_ids[t + 1]: tokens 7, 8, 10 sit at 2, 3, 5 -> mask at 1, 2, 4.
    assert batch.loss_mask.tolist()[0] == [0, 1, 1, 0, 1]
    assert batch.gen_logprobs[0].tolist() == pytest.approx([0, -0.1, -0.2, 0, -0.3])
    assert batch.loss_mask.tolist()[2] == [1, 0, 0, 0, 0]
    assert batch.gen_logprobs[2, 0].item() == pytest.approx(-0.4)
    assert batch.num_loss_tokens == 3 + 1 + 1 + 1
    # Groups need not be adjacent; g2 is unanimous, so its rows carry no signal.
    assert batch.advantages.tolist() == pytest.approx([1.0, 0.0, -1.0, 0.0])
    assert batch.group_ids == ("g1", "g2", "g1", "g2")


def test_build_batch_refuses_malformed_rows() -> None:
    ok = row("g", 0, 1.0, [Segment(kind="prompt", token_ids=[1]), policy([2], [-0.1])])
    with pytest.raises(ValueError, match="at least 2"):
        build_batch([ok], pad_id=0)
    with pytest.raises(ValueError, match="twice"):
        build_batch([ok, ok], pad_id=0)
    no_logprobs = row("g", 1, 0.0, [Segment(kind="prompt", token_ids=[1]), Segment(kind="policy", token_ids=[2])])
    with pytest.raises(ValueError, match="logprobs"):
        build_batch([ok, no_logprobs], pad_id=0)
    policy_first = row("g", 1, 0.0, [policy([2], [-0.1])])
    with pytest.raises(ValueError, match="first token"):
        build_batch([ok, policy_first], pad_id=0)


def test_end_to_end_step_on_a_tiny_model_moves_toward_the_rewarded_row() -> None:
    torch.manual_seed(0)
    vocab = 12
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab))
    rows = []
    for sibling, (token, reward) in enumerate([(7, 1.0), (8, 0.0)]):
        ids = torch.tensor([[3, token]])
        with torch.no_grad():
            gen = token_logprobs(model(ids), ids)[0, 0].item()
        rows.append(row("g", sibling, reward, [Segment(kind="prompt", token_ids=[3]), policy([token], [gen])]))
    batch = build_batch(rows, pad_id=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = torch.log_softmax(model(torch.tensor([3])), -1)[0]
    logprobs = token_logprobs(model(batch.input_ids), batch.input_ids)
    loss, stats = clipped_policy_loss(logprobs, batch.gen_logprobs, batch.advantages, batch.loss_mask, 0.2)
    assert stats.mean_ratio == pytest.approx(1.0, abs=1e-5)
    loss.backward()
    optimizer.step()
    after = torch.log_softmax(model(torch.tensor([3])), -1)[0]
    assert after[7] > before[7] and after[8] < before[8]


def test_mask_truncated_leaves_a_truncated_row_out_of_the_loss_but_in_its_groups_baseline():
    from tests.controller.state.test_data_plane import make_row
    from turnkeep.schemas.config_algorithm import AlgorithmConfig

    rows = [make_row("g", 0, reward=1.0), make_row("g", 1, reward=0.0).model_copy(update={"truncated": True}),
            make_row("g", 2, reward=0.0)]
    kept = build_batch(rows, 0, algorithm=AlgorithmConfig())
    masked = build_batch(rows, 0, algorithm=AlgorithmConfig(mask_truncated=True))
    assert kept.loss_mask[1].sum() == 2 and masked.loss_mask[1].sum() == 0
    assert torch.equal(masked.loss_mask[0], kept.loss_mask[0]) and torch.equal(masked.advantages, kept.advantages)
