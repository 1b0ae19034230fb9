"""The policy loss of `[algorithm]` (docs/algorithms.md): per-token losses (PPO's clipped surrogate with asymmetric
and dual clips, or CISPO), at the token or the sequence level (GSPO), an entropy bonus, aggregated by per-token
weights (`token_weights`) that make the sum over micro-batches and ranks the step's loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turnkeep.schemas.config_algorithm import AlgorithmConfig


@dataclass(frozen=True)
class PolicyLossStats:
    """Diagnostics of one loss call, over the masked (generated) tokens."""

    clip_fraction: float
    """Share of tokens whose clip is active (ppo_clip: their gradient is zero; cispo: their weight is truncated)."""
    mean_ratio: float
    """Mean importance ratio (exp of the token's, or its sequence's, log-ratio)."""
    approx_kl: float
    """Mean of gen_logprobs - logprobs: an estimate of KL(generating policy || current)."""
    num_tokens: int
    """Number of tokens the loss covers."""
    kl_reference: float = 0.0
    """Mean per-token KL estimate of the current policy against the reference (0 without one)."""


def token_weights(mask: torch.Tensor, algorithm: AlgorithmConfig, total_rows: int, total_tokens: int) -> torch.Tensor:
    """Each generated token's weight in the step's loss ([B, T], 0 where masked): summing weight x token loss over
    every micro-batch of every rank gives the aggregation `algorithm.loss_agg` names over the whole step, whose
    `total_rows` sequences hold `total_tokens` generated tokens."""
    m = mask.to(torch.float32)
    rows, tokens = max(total_rows, 1), max(total_tokens, 1)
    if algorithm.loss_agg == "token_mean":
        return m / tokens
    if algorithm.loss_agg == "seq_mean_token_sum":
        return m / rows
    if algorithm.loss_agg == "seq_mean_token_mean":
        return m / (m.sum(dim=-1, keepdim=True).clamp(min=1.0) * rows)
    if algorithm.loss_agg == "constant":
        return m / (rows * float(algorithm.loss_constant or 1))
    raise ValueError(f"unknown loss_agg {algorithm.loss_agg!r}")


def policy_loss(logprobs: torch.Tensor, gen_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                weights: torch.Tensor, algorithm: AlgorithmConfig, entropy: torch.Tensor | None = None,
                reference: torch.Tensor | None = None) -> tuple[torch.Tensor, PolicyLossStats]:
    """sum(weights x (per-token loss + kl_coef x KL estimate against `reference`)) - entropy_coef x
    sum(weights x entropy).

    `logprobs` (current policy, with grad), `gen_logprobs`, `mask`, `weights`, `entropy` and `reference` (the
    reference policy's logprobs; None: no KL term) are [B, T]; `advantages` is per row [B] or per token [B, T].
    `algorithm` must be `resolved` (its clips set)."""
    if logprobs.shape != gen_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)}, gen_logprobs {tuple(gen_logprobs.shape)} and mask "
                         f"{tuple(mask.shape)} must have the same shape")
    adv = advantages.to(torch.float32)
    if adv.dim() == logprobs.dim() - 1:
        adv = adv.unsqueeze(-1)
    keep = mask.to(torch.bool)
    current = logprobs.to(torch.float32)
    # Masked positions get log-ratio 0 before exp: padding may hold any logprob, and an inf there would turn into
    # NaN gradients even though its weight is zero.
    log_ratio = torch.where(keep, current - gen_logprobs.to(torch.float32), 0.0)
    ratio = torch.exp(_importance_log_ratio(log_ratio, keep, algorithm.importance_level))
    adv = adv.expand_as(ratio)
    per_token, clipped = _per_token_loss(ratio, adv, torch.where(keep, current, 0.0), algorithm)
    kl = None
    if reference is not None:
        kl = kl_estimate(torch.where(keep, current - reference.to(torch.float32), 0.0), algorithm.kl_estimator)
        per_token = per_token + algorithm.kl_coef * kl
    loss = (per_token * weights).sum()
    if entropy is not None and algorithm.entropy_coef:
        loss = loss - algorithm.entropy_coef * (entropy.to(torch.float32) * weights).sum()
    with torch.no_grad():
        count = int(keep.sum().item())
        safe = max(count, 1)
        m = keep.to(torch.float32)
        stats = PolicyLossStats(
            clip_fraction=float((clipped & keep).sum().item()) / safe,
            mean_ratio=float((ratio * m).sum().item()) / safe if count else 1.0,
            approx_kl=float((-log_ratio * m).sum().item()) / safe,
            num_tokens=count,
            kl_reference=float((kl * m).sum().item()) / safe if kl is not None else 0.0,
        )
    return loss, stats


def kl_estimate(log_ratio: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from log_ratio = log pi - log pi_ref at tokens sampled from pi
    (Schulman, "Approximating KL divergence", 2020): k1 is unbiased but can be negative, k2 and k3 are not negative
    and k3 is unbiased."""
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    raise ValueError(f"unknown kl_estimator {estimator!r}")


def _importance_log_ratio(log_ratio: torch.Tensor, keep: torch.Tensor, level: str) -> torch.Tensor:
    if level == "token":
        return log_ratio
    # GSPO: the sequence's log-ratio is the mean of its tokens', the same for every token of it.
    per_sequence = log_ratio.sum(dim=-1, keepdim=True) / keep.sum(dim=-1, keepdim=True).clamp(min=1)
    return per_sequence.expand_as(log_ratio)


def _per_token_loss(ratio: torch.Tensor, adv: torch.Tensor, logprobs: torch.Tensor,
                    algorithm: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token loss and where the clip is active."""
    low, high = 1.0 - algorithm.clip_low, 1.0 + algorithm.clip_high
    if algorithm.policy_loss == "cispo":
        # The weight is clipped (above) and detached: every token keeps the gradient of its logprob.
        weight = ratio.clamp(max=high).detach()
        return -weight * adv * logprobs, ratio.detach() > high
    loss = torch.maximum(-ratio * adv, -ratio.clamp(low, high) * adv)
    clipped = ((adv > 0) & (ratio > high)) | ((adv < 0) & (ratio < low))
    if algorithm.dual_clip is not None:
        # A very large ratio on a negative advantage would give an unbounded loss: cap it at -A x dual_clip.
        capped = torch.minimum(loss, -adv * algorithm.dual_clip)
        clipped = clipped | ((adv < 0) & (loss > -adv * algorithm.dual_clip))
        loss = torch.where(adv < 0, capped, loss)
    return loss, clipped.detach()


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the next-token distribution at each position: [B, T, V] -> [B, T-1], aligned as token_logprobs."""
    scores = logits[:, :-1].to(torch.float32)
    if temperature != 1.0:
        scores = scores / temperature
    log_probs = torch.log_softmax(scores, dim=-1)
    return -(log_probs.exp() * log_probs).sum(dim=-1)
