"""The `[algorithm]` table: the advantage estimator, the policy loss and how it is aggregated (docs/algorithms.md
gives every formula with its paper)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from turnkeep.schemas.config_base import ModelPath, StrictModel


class AlgorithmConfig(StrictModel):
    _max_tokens: int | None = PrivateAttr(default=None)

    advantage: Literal["rloo", "grpo", "reinforce_pp"] = "rloo"
    """`rloo`: r_i minus the mean of the group's other rewards (leave-one-out); `grpo`: r_i minus the group mean;
    `reinforce_pp`: r_i minus the batch mean, divided by the batch std (REINFORCE++)."""
    scale_rewards: Literal["none", "group", "batch"] = "none"
    """rloo and grpo: divide the advantages by the group's reward std (`group`, GRPO's original), the batch's
    (`batch`), or not (`none`, Dr. GRPO)."""
    loss_agg: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "constant"] = "token_mean"
    """How the per-token losses become the step's loss: the mean over every generated token of the step
    (`token_mean`, DAPO); the mean over sequences of each one's token sum or token mean; or the token sum over
    sequences times a constant normaliser (`constant`, Dr. GRPO: divided by rows x `loss_constant`)."""
    loss_constant: int | None = Field(default=None, ge=1)
    """`constant`'s normaliser per sequence (None: rollout.max_turns x rollout.max_tokens_per_turn)."""
    policy_loss: Literal["ppo_clip", "cispo"] = "ppo_clip"
    """`ppo_clip`: PPO's clipped surrogate; `cispo`: the importance weight clipped and detached, times the advantage
    times the token's logprob, so every token keeps a gradient (MiniMax-M1)."""
    clip_low: float | None = Field(default=None, gt=0, lt=1)
    """The ratio's lower clip is 1 - clip_low (None: train.clip_eps)."""
    clip_high: float | None = Field(default=None, gt=0)
    """The ratio's upper clip is 1 + clip_high (None: clip_low); DAPO's clip-higher uses 0.28 with clip_low 0.2."""
    dual_clip: float | None = Field(default=None, gt=1)
    """ppo_clip, negative advantages: the loss is at most -A x dual_clip (dual-clip PPO; None: off)."""
    importance_level: Literal["token", "sequence"] = "token"
    """`sequence`: each sequence's ratio is exp(mean of its tokens' log-ratios), for all its tokens (GSPO)."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Entropy bonus: minus this times the mean entropy of the policy over the generated tokens (0: off)."""
    tis_cap: float | None = Field(default=None, ge=1)
    """Truncated importance sampling for the engine/trainer mismatch (None: off). The ratio is then taken against
    the trainer's own logprobs before the step's update (one more forward in the step's first pass) instead of the
    engine's, and each token is weighted by min(pi_trainer / pi_engine, tis_cap). The step line reports the mismatch
    (`trainer_engine_mismatch_mean`, `_max`: |log pi_trainer - log pi_engine| over the generated tokens)."""
    mask_truncated: bool = False
    """Leave rows that ended without their final answer (max_turns or max_model_len) out of the loss; their rewards
    still count in their group's baseline (TRL's mask_truncated_completions)."""
    overlong_buffer: int | None = Field(default=None, ge=1)
    """DAPO's soft overlong punishment (None: off): a row that generated more than L - overlong_buffer tokens, L the
    most a row can generate (rollout.max_turns x rollout.max_tokens_per_turn), loses overlong_penalty x the share of
    the buffer it used from its reward, before the advantages."""
    overlong_penalty: float = Field(default=1.0, gt=0)
    """The most the overlong punishment takes from a reward (at L tokens)."""
    drop_zero_signal: bool = False
    """Dynamic sampling (DAPO): a complete group whose rewards are all equal carries no signal; discard it (reason
    `zero_signal`, counted in metrics.jsonl's `groups_discarded_total`) and fill the step with other groups."""

    kl_coef: float = Field(default=0.0, ge=0)
    """KL to a frozen reference policy (0: off, and no reference is loaded): the reference's logprobs are computed
    in the trainer, on every rank, sharded like the policy. Checkpoints leave it out; it is loaded again from its
    folder."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token estimate of KL(pi || pi_ref) from d = log pi - log pi_ref: `k1` = d, `k2` = d^2 / 2, `k3` =
    exp(-d) + d - 1 (Schulman's estimators; k3 is GRPO's and TRL's)."""
    kl_in: Literal["loss", "reward"] = "loss"
    """`loss`: kl_coef x the estimate of the current policy against the reference, per token, added to the policy
    loss (GRPO, TRL's beta); `reward`: kl_coef x the sum of the estimate over a row's tokens, of the policy that
    generated it against the reference, taken from its reward before the advantages (PPO-RLHF, verl's
    use_kl_in_reward)."""
    reference_path: ModelPath | None = None
    """The reference model: a folder or a hub id with the policy's tokenizer (None: the run's starting weights,
    model.path or the tiny model)."""

    @model_validator(mode="after")
    def _cispo_clips_above_only(self) -> "AlgorithmConfig":
        if self.policy_loss == "cispo" and self.dual_clip is not None:
            raise ValueError("algorithm.dual_clip applies to policy_loss = \"ppo_clip\"; CISPO clips the importance "
                             "weight itself: remove dual_clip or use ppo_clip")
        if self.advantage == "reinforce_pp" and self.scale_rewards != "none":
            raise ValueError("algorithm.advantage = \"reinforce_pp\" already normalises over the batch; leave "
                             "scale_rewards = \"none\"")
        if self.reference_path is not None and not self.kl_coef:
            raise ValueError("algorithm.reference_path is set but algorithm.kl_coef = 0, so no reference is used: "
                             "set kl_coef > 0, or remove reference_path")
        return self

    def resolved(self, clip_eps: float, max_tokens: int) -> "AlgorithmConfig":
        """The settings with their defaults filled: clips from train.clip_eps, the constant from the rollout shape
        (`max_tokens`: the most a row can generate). Raises ValueError for a buffer that does not fit it."""
        if self.overlong_buffer is not None and self.overlong_buffer >= max_tokens:
            raise ValueError(f"algorithm.overlong_buffer = {self.overlong_buffer} must be below the {max_tokens} tokens "
                             "a row can generate (rollout.max_turns x rollout.max_tokens_per_turn); lower it")
        low = self.clip_low if self.clip_low is not None else clip_eps
        resolved = self.model_copy(update={"clip_low": low, "clip_high": self.clip_high if self.clip_high is not None
                                           else low, "loss_constant": self.loss_constant or max_tokens})
        resolved._max_tokens = max_tokens
        return resolved

    @property
    def max_tokens(self) -> int | None:
        """Set by `resolved`: the most a row can generate (the overlong punishment's L)."""
        return self._max_tokens
