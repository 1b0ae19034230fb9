"""GRPO math: advantages, the clipped policy loss, and packing rollout rows into tensors.

The default algorithm, as the train pump runs it on a batch of complete prompt groups (`[algorithm]` chooses
other estimators, losses and aggregations: `gpu_workers/advantages.py`, `gpu_workers/policy_loss.py`,
docs/algorithms.md):

1. **Advantages, leave-one-out per group.** Each prompt has N siblings with rewards
   r_1..r_N. Sibling i's advantage is A_i = r_i - mean_{j != i} r_j (the RLOO
   baseline). It is the same for every token the sibling generated.
2. **Clipped surrogate against the generation logprobs.** For every generated
   (policy) token, ratio = exp(logprob_now - logprob_at_generation), and the
   objective is PPO's min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A). The "old
   policy" is the policy that generated the token, with the logprobs the policy
   server returned, not a recomputed forward pass: in an asynchronous runtime the
   rows are up to `max_staleness` versions old, and the ratio is what corrects for
   that (and for small numeric differences between the inference engine and the
   trainer).
3. **Token-mean loss.** loss = -sum(surrogate * mask) / sum(mask) over every
   generated token in the batch (prompt and tool-result tokens are masked out: the
   policy did not choose them).

Where this departs from the GRPO paper (Shao et al., 2024, DeepSeekMath):

- **Baseline: leave-one-out mean instead of the group mean.** A baseline that
  includes r_i depends on the very sample it is subtracted from; leaving r_i out
  keeps the policy-gradient estimator unbiased (RLOO, Ahmadian et al., 2024). The
  group-mean version is the same thing shrunk by (N-1)/N, so the change is small,
  but this is the exact one. A group's advantages still sum to zero.
- **No division by the group's reward std (off by default).** With a leave-one-out
  baseline the advantage already has the right sign and scale for 0/1 rewards, and
  dividing by the std reweights prompts by how unanimous their group was (a group
  with one success among eight gets its advantages blown up), which biases which
  questions the policy learns from (Dr. GRPO, Liu et al., 2025). `scale_by_std=True`
  turns it back on for comparison.
- **No KL penalty to a reference model.** With a verifiable reward there is no
  learned reward model to exploit, the clip already bounds each update's move away
  from the generating policy, and dropping it saves a reference-model forward pass
  (as DAPO and Dr. GRPO do).
- **Token-mean over the batch instead of a per-sequence mean.** The paper averages
  within each sequence first, which gives the tokens of short answers more weight
  than those of long ones; the token mean does not (DAPO's token-level loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from turnkeep.gpu_workers.advantages import (
    batched_leave_one_out_advantages,
    leave_one_out_advantages,
    overlong_penalties,
    row_advantages,
)
from turnkeep.gpu_workers.policy_loss import PolicyLossStats, policy_loss
from turnkeep.schemas.config_algorithm import AlgorithmConfig
from turnkeep.schemas.rollout import RolloutRow

__all__ = ["PolicyLossStats", "batched_leave_one_out_advantages", "build_batch", "clipped_policy_loss",
           "leave_one_out_advantages", "token_logprobs"]


def clipped_policy_loss(
    logprobs: torch.Tensor,
    gen_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    *,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """The default loss of `[algorithm]`: PPO-style clipped surrogate against the generation logprobs, token-mean.

    `logprobs` (current policy, with grad), `gen_logprobs` and `mask` are [B, T];
    `advantages` is per row [B] or per token [B, T]. The loss is
    -sum(min(ratio*A, clip(ratio)*A) * mask) / denominator, where the denominator is
    `num_tokens` if given (pass the whole batch's token count when accumulating
    gradients over micro-batches, so the result is still a token mean) or
    sum(mask) otherwise.
    """
    algorithm = AlgorithmConfig(clip_low=clip_eps, clip_high=clip_eps)
    count = int(mask.to(torch.bool).sum().item()) if num_tokens is None else num_tokens
    weights = mask.to(torch.float32) / float(max(count, 1))
    return policy_loss(logprobs, gen_logprobs, advantages, mask, weights, algorithm)


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """Logprob of each next token: [B, T, V] logits, [B, T] ids -> [B, T-1].

    Entry t is log p(input_ids[:, t+1] | input_ids[:, :t+1]), aligned to
    input_ids[:, 1:]. Computed in float32. `temperature` divides the logits first; it
    must match how the policy server computed the generation logprobs, or the ratio
    is off by a constant factor.
    """
    if logits.dim() != 3 or input_ids.dim() != 2 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"expected logits [B, T, V] and input_ids [B, T], got {tuple(logits.shape)} "
            f"and {tuple(input_ids.shape)}"
        )
    scores = logits[:, :-1].to(torch.float32)
    if temperature != 1.0:
        scores = scores / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    # gather minus logsumexp avoids materialising a second [B, T, V] log_softmax tensor.
    picked = scores.gather(-1, targets).squeeze(-1)
    return picked - torch.logsumexp(scores, dim=-1)


@dataclass(frozen=True)
class PackedBatch:
    """Rollout rows as padded tensors, right-padded; B rows, T the longest row."""

    input_ids: torch.Tensor
    """[B, T] int64 token ids (pad_id after each row's end)."""
    attention_mask: torch.Tensor
    """[B, T] int64, 1 on real tokens."""
    loss_mask: torch.Tensor
    """[B, T-1] float32, 1 at position t when input_ids[:, t+1] is a policy token."""
    gen_logprobs: torch.Tensor
    """[B, T-1] float32 generation logprob of input_ids[:, t+1] (0 where masked out)."""
    advantages: torch.Tensor
    """[B] float32 advantage of each row (`gpu_workers/advantages.py`)."""
    rewards: torch.Tensor
    """[B] float32 reward of each row."""
    group_ids: tuple[str, ...]
    """Group of each row, in row order."""

    @property
    def num_loss_tokens(self) -> int:
        """Generated tokens the loss covers."""
        return int(self.loss_mask.sum().item())

    def rows(self, start: int, stop: int) -> PackedBatch:
        """Rows `start:stop` as a batch of their own (a micro-batch), cut to its longest row."""
        width = int(self.attention_mask[start:stop].sum(dim=1).max().item())
        return PackedBatch(
            input_ids=self.input_ids[start:stop, :width], attention_mask=self.attention_mask[start:stop, :width],
            loss_mask=self.loss_mask[start:stop, : width - 1], gen_logprobs=self.gen_logprobs[start:stop, : width - 1],
            advantages=self.advantages[start:stop], rewards=self.rewards[start:stop],
            group_ids=self.group_ids[start:stop],
        )

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch with every tensor moved to `device`."""
        moved = {
            f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
            for f in fields(self)
        }
        return PackedBatch(**moved)


def _row_tokens(row: RolloutRow) -> tuple[list[int], list[float], list[int]]:
    """Concatenate a row's segments: ids, then per position t-1 the gen logprob and mask."""
    ids: list[int] = []
    gen: list[float] = []
    mask: list[int] = []
    for index, segment in enumerate(row.segments):
        is_policy = segment.kind == "policy"
        if is_policy:
            if segment.logprobs is None or len(segment.logprobs) != len(segment.token_ids):
                got = None if segment.logprobs is None else len(segment.logprobs)
                raise ValueError(
                    f"group {row.group_id!r} sibling {row.sibling}: policy segment {index} has "
                    f"{len(segment.token_ids)} tokens but logprobs {got}"
                )
        for k, token in enumerate(segment.token_ids):
            if ids:
                # Position len(ids)-1 predicts this token.
                gen.append(float(segment.logprobs[k]) if is_policy else 0.0)  # type: ignore[index]
                mask.append(1 if is_policy else 0)
            elif is_policy:
                raise ValueError(
                    f"group {row.group_id!r} sibling {row.sibling}: the first token is a policy "
                    "token, but nothing precedes it to predict it from"
                )
            ids.append(token)
    return ids, gen, mask


def build_batch(rows: Sequence[RolloutRow], pad_id: int, *, scale_by_std: bool = False,
                algorithm: AlgorithmConfig | None = None, reward_shaping: Sequence[float] | None = None) -> PackedBatch:
    """Pack rollout rows into padded tensors with per-row advantages (`algorithm`'s estimator; None: leave-one-out,
    divided by the group's std with `scale_by_std`), computed from the rewards plus `reward_shaping` (per row; the
    KL penalty of `kl_in = "reward"`) and the overlong punishment.

    Rows are grouped by `group_id` (a group's rows need not be adjacent); each group
    needs at least two rows and no sibling twice, since the same sibling in a batch
    twice would train on it twice.
    """
    if not rows:
        raise ValueError("build_batch needs at least one row")
    members: dict[str, list[int]] = {}
    seen: set[tuple[str, int]] = set()
    for i, row in enumerate(rows):
        if (row.group_id, row.sibling) in seen:
            raise ValueError(f"group {row.group_id!r} has sibling {row.sibling} twice in one batch")
        seen.add((row.group_id, row.sibling))
        members.setdefault(row.group_id, []).append(i)

    algorithm = algorithm or AlgorithmConfig(scale_rewards="group" if scale_by_std else "none")
    rewards = torch.tensor([row.reward for row in rows], dtype=torch.float32)
    shaped = rewards + overlong_penalties(rows, algorithm)
    if reward_shaping is not None:
        shaped = shaped + torch.tensor(list(reward_shaping), dtype=torch.float32)
    for group_id, indices in members.items():
        if len(indices) < 2:
            raise ValueError(f"group {group_id!r} has {len(indices)} row(s); GRPO needs at least 2")
    advantages = row_advantages(shaped, members, algorithm)

    packed = [_row_tokens(row) for row in rows]
    width = max(len(ids) for ids, _, _ in packed)
    batch = len(rows)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.int64)
    attention_mask = torch.zeros((batch, width), dtype=torch.int64)
    loss_mask = torch.zeros((batch, max(width - 1, 0)), dtype=torch.float32)
    gen_logprobs = torch.zeros((batch, max(width - 1, 0)), dtype=torch.float32)
    for b, (ids, gen, mask) in enumerate(packed):
        input_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        attention_mask[b, : len(ids)] = 1
        if gen:
            gen_logprobs[b, : len(gen)] = torch.tensor(gen, dtype=torch.float32)
            if not (algorithm.mask_truncated and rows[b].truncated):
                loss_mask[b, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return PackedBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        gen_logprobs=gen_logprobs,
        advantages=advantages,
        rewards=rewards,
        group_ids=tuple(row.group_id for row in rows),
    )
