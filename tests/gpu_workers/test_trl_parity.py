"""turnkeep's policy loss checked against TRL 1.16.0's GRPOTrainer, its real `_compute_loss` (docs/algorithms.md,
"Checked against TRL").

For one fixed batch (per-token logprobs, the generating policy's logprobs, per-row advantages, a ragged mask) each
loss_type both libraries have (grpo, bnpo, dr_grpo, dapo, luspo, cispo, GSPO's sequence-level ratio, clip-higher,
TRL's `delta` as turnkeep's dual clip, TRL's `beta` as kl_coef with k3) gives the same loss and the same gradient
w.r.t. the logprobs to 1e-6. Where the two define a setting differently the test asserts the difference, computed
from the definitions, instead of skipping: CISPO's cap (TRL's `epsilon_high` is the absolute cap on the ratio,
turnkeep's `clip_high` caps it at 1 + clip_high), the entropy bonus (TRL takes the mean entropy over tokens whatever
the loss_type, turnkeep weighs it like the policy loss), gradient accumulation (grpo, bnpo, dr_grpo and luspo
normalise each micro-batch by its own rows or tokens in TRL, by the step's in turnkeep) and TRL's default KL bias
correction (the KL estimate times the importance ratio).

TRL's trainer is made without its __init__ (which needs a model, data and reward functions): its loss settings
are copied from a real GRPOConfig as GRPOTrainer.__init__ copies them, the rest of what `_compute_loss` reads is set
for one process, training mode and the accumulation window, and the model's forward
(`_get_per_token_logps_and_entropies`) is replaced on the instance by the fixed logprobs."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from turnkeep.gpu_workers.policy_loss import policy_loss, token_weights
from turnkeep.schemas.config_algorithm import AlgorithmConfig

MAX_COMPLETION_LENGTH = 8
"""TRL's max_completion_length and turnkeep's max_tokens (the most a row can generate: Dr. GRPO's constant)."""
TOLERANCE = dict(atol=1e-6, rtol=0.0)
LENGTHS = [6, 3, 5, 1, 4]
ADVANTAGES = [1.0, -0.5, 2.0, -1.5, 0.75]
SCALES = [1e-5, 0.4, 1e-4, 0.5, 0.3]
"""Each row's spread of log-ratios: rows 0 and 2 stay inside GSPO's tiny clip, the others cross PPO's."""


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprobs, gen_logprobs, advantages, mask), float32 [B, T] ([B] for the advantages), with ratios on both
    sides of every clip: a ratio of 5 on a negative advantage (dual clip, delta) and one of 6 on a positive one."""
    generator = torch.Generator().manual_seed(47)
    rows, width = len(LENGTHS), max(LENGTHS)
    gen = -0.1 - 3.0 * torch.rand(rows, width, generator=generator)
    noise = torch.randn(rows, width, generator=generator) * torch.tensor(SCALES).unsqueeze(-1)
    current = gen + noise
    current[1, 0] = gen[1, 0] + math.log(5.0)
    current[4, 1] = gen[4, 1] + math.log(6.0)
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(-1)).to(torch.float32)
    return current, gen, torch.tensor(ADVANTAGES), mask


def _trl_trainer(config: GRPOConfig) -> GRPOTrainer:
    """A GRPOTrainer whose `_compute_loss` sees `config`'s loss settings (its forward is set per micro-batch)."""
    trainer = object.__new__(GRPOTrainer)
    settings = dict(
        # As GRPOTrainer.__init__ copies them from its args.
        args=config, loss_type=config.loss_type, beta=config.beta, epsilon_low=config.epsilon,
        epsilon_high=config.epsilon_high if config.epsilon_high is not None else config.epsilon,
        importance_sampling_level=config.importance_sampling_level, max_completion_length=config.max_completion_length,
        top_entropy_quantile=config.top_entropy_quantile, off_policy_mask_threshold=config.off_policy_mask_threshold,
        use_vllm=config.use_vllm, entropy_coef=config.entropy_coef, use_adaptive_entropy=config.use_adaptive_entropy,
        _entropy_bonus_enabled=config.entropy_coef != 0.0 or config.use_adaptive_entropy,
        # What training sets: one process, the accumulation window, training mode, no MoE aux loss, metric holders.
        current_gradient_accumulation_steps=config.gradient_accumulation_steps, aux_loss_enabled=False,
        model=SimpleNamespace(training=True), _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        accelerator=SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda t: t,
                                    gather_for_metrics=lambda t: t, reduce=lambda t, reduction: t),
    )
    for name, value in settings.items():
        setattr(trainer, name, value)
    return trainer


def _trl(entropy: torch.Tensor | None = None, micro_batches: list[list[int]] | None = None,
         reference: torch.Tensor | None = None, **grpo_config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """TRL's loss of the batch under GRPOConfig(**grpo_config), summed over `micro_batches` (rows; default: one
    of all) accumulated in one step: (loss, d loss / d logprobs, d loss / d entropy)."""
    current, gen, advantages, mask = _batch()
    micro_batches = micro_batches or [list(range(len(LENGTHS)))]
    logprobs = current.clone().requires_grad_(True)
    entropies = (entropy if entropy is not None else torch.ones_like(current)).clone().requires_grad_(True)
    # use_cpu: TrainingArguments refuses its bf16 default on a machine without a GPU; the loss never reads it.
    config = GRPOConfig(output_dir="unused", report_to=[], use_cpu=True, max_completion_length=MAX_COMPLETION_LENGTH,
                        gradient_accumulation_steps=len(micro_batches), **grpo_config)
    trainer = _trl_trainer(config)
    loss = torch.zeros(())
    for rows in micro_batches:
        # The model's forward: (per-token logprobs, entropies, aux loss) of the micro-batch's rows.
        trainer._get_per_token_logps_and_entropies = lambda *args, rows=rows, **kwargs: (
            logprobs[rows], entropies[rows], None)
        inputs = {
            "prompt_ids": torch.zeros(len(rows), 1, dtype=torch.long),
            "prompt_mask": torch.ones(len(rows), 1, dtype=torch.long),
            "completion_ids": torch.zeros(len(rows), current.shape[1], dtype=torch.long),
            "completion_mask": mask[rows], "advantages": advantages[rows], "old_per_token_logps": gen[rows],
            "num_items_in_batch": mask.sum(),  # the generation batch's completion tokens (one process)
        }
        if reference is not None:
            inputs["ref_per_token_logps"] = reference[rows]
        loss = loss + trainer._compute_loss(None, inputs)
    loss.backward()
    return loss.detach(), logprobs.grad, entropies.grad if entropy is not None else None


def _turnkeep(entropy: torch.Tensor | None = None, micro_batches: list[list[int]] | None = None,
              per_micro_batch: bool = False, reference: torch.Tensor | None = None, clip_eps: float = 0.2,
              **algorithm_settings):
    """turnkeep's loss of the batch under AlgorithmConfig(**algorithm_settings), summed over `micro_batches`:
    (loss, d loss / d logprobs, d loss / d entropy, the last micro-batch's stats). Its token weights use the step's
    rows and tokens, or with `per_micro_batch` each micro-batch's own, divided by their number (TRL's way)."""
    current, gen, advantages, mask = _batch()
    micro_batches = micro_batches or [list(range(len(LENGTHS)))]
    algorithm = AlgorithmConfig(**algorithm_settings).resolved(clip_eps=clip_eps, max_tokens=MAX_COMPLETION_LENGTH)
    logprobs = current.clone().requires_grad_(True)
    entropies = entropy.clone().requires_grad_(True) if entropy is not None else None
    loss = torch.zeros(())
    for rows in micro_batches:
        part = mask[rows]
        if per_micro_batch:
            weights = token_weights(part, algorithm, len(rows), int(part.sum().item())) / len(micro_batches)
        else:
            weights = token_weights(part, algorithm, total_rows=len(LENGTHS), total_tokens=int(mask.sum().item()))
        part_loss, stats = policy_loss(logprobs[rows], gen[rows], advantages[rows], part, weights, algorithm,
                                       entropy=entropies[rows] if entropies is not None else None,
                                       reference=reference[rows] if reference is not None else None)
        loss = loss + part_loss
    loss.backward()
    return loss.detach(), logprobs.grad, entropies.grad if entropies is not None else None, stats


CLIP_HIGHER = (dict(epsilon=0.2, epsilon_high=0.28), dict(clip_low=0.2, clip_high=0.28))
GSPO = (dict(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
        dict(importance_level="sequence", clip_low=3e-4, clip_high=4e-4))
SAME = {
    # case: (TRL GRPOConfig settings, turnkeep [algorithm] settings); clip_eps 0.2 = TRL's default epsilon.
    "grpo": (dict(loss_type="grpo"), dict(loss_agg="seq_mean_token_mean")),
    "bnpo": (dict(loss_type="bnpo"), dict(loss_agg="token_mean")),
    "dr_grpo": (dict(loss_type="dr_grpo"), dict(loss_agg="constant")),  # constant from max_tokens = 8
    "dapo": (dict(loss_type="dapo"), dict(loss_agg="token_mean")),
    "luspo": (dict(loss_type="luspo"), dict(loss_agg="seq_mean_token_sum")),
    **{f"{loss_type} clip-higher": (dict(loss_type=loss_type, **CLIP_HIGHER[0]), dict(loss_agg=agg, **CLIP_HIGHER[1]))
       for loss_type, agg in [("grpo", "seq_mean_token_mean"), ("bnpo", "token_mean"), ("dr_grpo", "constant"),
                              ("dapo", "token_mean"), ("luspo", "seq_mean_token_sum")]},
    "gspo": (dict(loss_type="grpo", **GSPO[0]), dict(loss_agg="seq_mean_token_mean", **GSPO[1])),
    "gspo dapo": (dict(loss_type="dapo", **GSPO[0]), dict(loss_agg="token_mean", **GSPO[1])),
    "gspo luspo": (dict(loss_type="luspo", **GSPO[0]), dict(loss_agg="seq_mean_token_sum", **GSPO[1])),
    "gspo at PPO's clip": (dict(loss_type="grpo", importance_sampling_level="sequence"),
                           dict(loss_agg="seq_mean_token_mean", importance_level="sequence")),
    "cispo": (dict(loss_type="cispo", epsilon_high=1.28), dict(policy_loss="cispo", clip_high=0.28)),
    "cispo ScaleRL": (dict(loss_type="cispo", epsilon_high=5.0), dict(policy_loss="cispo", clip_high=4.0)),
    "delta = dual_clip": (dict(loss_type="dapo", **CLIP_HIGHER[0], delta=3.0),
                          dict(loss_agg="token_mean", dual_clip=3.0, **CLIP_HIGHER[1])),
}


@pytest.mark.parametrize("case", list(SAME))
def test_turnkeep_equals_trl(case: str) -> None:
    trl_settings, turnkeep_settings = SAME[case]
    trl_loss, trl_grad, _ = _trl(**trl_settings)
    loss, grad, _, stats = _turnkeep(**turnkeep_settings)
    torch.testing.assert_close(loss, trl_loss, **TOLERANCE)
    torch.testing.assert_close(grad, trl_grad, **TOLERANCE)
    assert trl_grad.abs().max() > 1e-3, "the batch gives the loss a gradient"
    assert 0.0 < stats.clip_fraction < 1.0, "some tokens are clipped and some not: both sides are compared"


def _ratios_and_weights(**algorithm_settings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ratio, advantage per token, logprobs, turnkeep's token weights), float64, for the cases computed by hand."""
    current, gen, advantages, mask = _batch()
    algorithm = AlgorithmConfig(**algorithm_settings).resolved(clip_eps=0.2, max_tokens=MAX_COMPLETION_LENGTH)
    weights = token_weights(mask, algorithm, total_rows=mask.shape[0], total_tokens=int(mask.sum().item()))
    ratio = torch.exp((current - gen).double()) * mask
    return ratio, advantages.double().unsqueeze(-1).expand_as(ratio), current.double() * mask, weights.double()


def test_cispo_with_the_same_number_differs_by_the_cap_trl_reads_as_absolute() -> None:
    """TRL's cispo caps the ratio at epsilon_high itself, turnkeep's at 1 + clip_high: with both 0.28, TRL weighs
    every token by min(r, 0.28), turnkeep by min(r, 1.28). Per token, (turnkeep - TRL) = -(min(r, 1.28) -
    min(r, 0.28)) x A x logprob, weighted by the token mean; its gradient w.r.t. the logprob drops the logprob."""
    trl_loss, trl_grad, _ = _trl(loss_type="cispo", epsilon_high=0.28)
    loss, grad, _, _ = _turnkeep(policy_loss="cispo", clip_high=0.28)
    ratio, advantage, logprobs, weights = _ratios_and_weights(policy_loss="cispo", clip_high=0.28)
    cap_gap = ratio.clamp(max=1.28) - ratio.clamp(max=0.28)
    loss_gap = (-cap_gap * advantage * logprobs * weights).sum()
    grad_gap = -cap_gap * advantage * weights
    assert abs(loss_gap.item()) > 1e-2 and grad_gap.abs().max() > 1e-2, "the two caps give clearly different losses"
    torch.testing.assert_close(loss.double() - trl_loss.double(), loss_gap, **TOLERANCE)
    torch.testing.assert_close(grad.double() - trl_grad.double(), grad_gap, **TOLERANCE)


def test_cispo_under_trl_defaults_caps_every_ratio_at_0_2() -> None:
    """TRL's cispo without epsilon_high caps the ratio at epsilon = 0.2: turnkeep's clip_high = -0.8 would be that,
    which turnkeep does not accept (clip_high > 0); the loss is then -0.2 x A x logprob per token for r >= 0.2."""
    trl_loss, trl_grad, _ = _trl(loss_type="cispo")
    ratio, advantage, logprobs, weights = _ratios_and_weights(loss_agg="token_mean")
    assert bool((ratio[weights > 0] > 0.2).all())
    torch.testing.assert_close(trl_loss.double(), (-0.2 * advantage * logprobs * weights).sum(), **TOLERANCE)
    torch.testing.assert_close(trl_grad.double(), -0.2 * advantage * weights, **TOLERANCE)
    with pytest.raises(ValueError):
        AlgorithmConfig(policy_loss="cispo", clip_high=-0.8)


def _entropy() -> torch.Tensor:
    return 0.5 + torch.rand(len(LENGTHS), max(LENGTHS), generator=torch.Generator().manual_seed(6))


@pytest.mark.parametrize("loss_type, loss_agg", [("bnpo", "token_mean"), ("dapo", "token_mean")])
def test_entropy_bonus_equals_trl_for_the_token_mean(loss_type: str, loss_agg: str) -> None:
    trl_loss, trl_grad, trl_entropy_grad = _trl(entropy=_entropy(), loss_type=loss_type, entropy_coef=0.01)
    loss, grad, entropy_grad, _ = _turnkeep(entropy=_entropy(), loss_agg=loss_agg, entropy_coef=0.01)
    torch.testing.assert_close(loss, trl_loss, **TOLERANCE)
    torch.testing.assert_close(grad, trl_grad, **TOLERANCE)
    torch.testing.assert_close(entropy_grad, trl_entropy_grad, **TOLERANCE)


@pytest.mark.parametrize("loss_type, loss_agg", [("grpo", "seq_mean_token_mean"), ("dr_grpo", "constant"),
                                                 ("luspo", "seq_mean_token_sum")])
def test_entropy_bonus_differs_where_turnkeep_weighs_it_like_the_loss(loss_type: str, loss_agg: str) -> None:
    """TRL subtracts coef x (token mean of H) for every loss_type; turnkeep subtracts coef x sum(weights x H) with
    the loss's own weights: (turnkeep - TRL) = coef x (mean(H) - sum(weights x H)), the policy part equal."""
    entropy, coef = _entropy(), 0.01
    trl_loss, trl_grad, trl_entropy_grad = _trl(entropy=entropy, loss_type=loss_type, entropy_coef=coef)
    loss, grad, entropy_grad, _ = _turnkeep(entropy=entropy, loss_agg=loss_agg, entropy_coef=coef)
    _, _, _, weights = _ratios_and_weights(loss_agg=loss_agg)
    mask = (weights > 0).double()
    token_mean = mask / mask.sum()
    loss_gap = coef * ((token_mean - weights) * entropy.double()).sum()
    assert abs(loss_gap.item()) > 1e-5
    torch.testing.assert_close(loss.double() - trl_loss.double(), loss_gap, **TOLERANCE)
    torch.testing.assert_close(grad, trl_grad, **TOLERANCE)
    torch.testing.assert_close(entropy_grad.double() - trl_entropy_grad.double(), coef * (token_mean - weights),
                               **TOLERANCE)


MICRO_BATCHES = [[0, 1], [2, 3, 4]]
"""One step's batch split in two micro-batches of 2 and 3 rows (4 + 10 tokens), accumulated."""


@pytest.mark.parametrize("trl_settings, turnkeep_settings", [
    (dict(loss_type="dapo"), dict(loss_agg="token_mean")),
    (dict(loss_type="cispo", epsilon_high=1.28), dict(policy_loss="cispo", clip_high=0.28)),
])
def test_accumulated_micro_batches_equal_trl_where_its_normaliser_spans_the_step(trl_settings, turnkeep_settings):
    """dapo and cispo divide by num_items_in_batch, the step's tokens: the split does not matter, as in turnkeep."""
    trl_loss, trl_grad, _ = _trl(micro_batches=MICRO_BATCHES, **trl_settings)
    loss, grad, _, _ = _turnkeep(micro_batches=MICRO_BATCHES, **turnkeep_settings)
    whole_loss, whole_grad, _, _ = _turnkeep(**turnkeep_settings)
    torch.testing.assert_close(loss, trl_loss, **TOLERANCE)
    torch.testing.assert_close(grad, trl_grad, **TOLERANCE)
    torch.testing.assert_close(loss, whole_loss, **TOLERANCE)
    torch.testing.assert_close(grad, whole_grad, **TOLERANCE)


@pytest.mark.parametrize("loss_type, loss_agg", [("grpo", "seq_mean_token_mean"), ("bnpo", "token_mean"),
                                                 ("dr_grpo", "constant"), ("luspo", "seq_mean_token_sum")])
def test_accumulated_micro_batches_differ_where_trl_normalises_each_one(loss_type: str, loss_agg: str) -> None:
    """grpo, bnpo, dr_grpo and luspo divide each micro-batch's loss by its own rows or tokens, then by the number of
    micro-batches: the step's loss depends on the split. turnkeep's token weights use the step's totals, so its
    loss is the whole batch's. (turnkeep - TRL) = (turnkeep's loss) - (turnkeep's loss with each micro-batch's own
    totals / 2), in value and gradient."""
    trl_loss, trl_grad, _ = _trl(micro_batches=MICRO_BATCHES, loss_type=loss_type)
    loss, grad, _, _ = _turnkeep(micro_batches=MICRO_BATCHES, loss_agg=loss_agg)
    local_loss, local_grad, _, _ = _turnkeep(micro_batches=MICRO_BATCHES, per_micro_batch=True, loss_agg=loss_agg)
    whole_loss, _, _, _ = _turnkeep(loss_agg=loss_agg)
    assert abs((loss - local_loss).item()) > 1e-3, "the split changes TRL's loss clearly"
    torch.testing.assert_close(loss, whole_loss, **TOLERANCE)
    torch.testing.assert_close(loss - trl_loss, loss - local_loss, **TOLERANCE)
    torch.testing.assert_close(grad - trl_grad, grad - local_grad, **TOLERANCE)


def _reference() -> torch.Tensor:
    """The reference policy's logprobs of the batch's tokens: the generating policy's, moved by up to 0.6."""
    _, gen, _, _ = _batch()
    return gen - 0.3 + 0.6 * torch.rand(gen.shape, generator=torch.Generator().manual_seed(7))


KL = {
    "grpo": (dict(loss_type="grpo"), dict(loss_agg="seq_mean_token_mean")),
    "dapo clip-higher": (dict(loss_type="dapo", **CLIP_HIGHER[0]), dict(loss_agg="token_mean", **CLIP_HIGHER[1])),
    "gspo": (dict(loss_type="grpo", **GSPO[0]), dict(loss_agg="seq_mean_token_mean", **GSPO[1])),
    "cispo": (dict(loss_type="cispo", epsilon_high=1.28), dict(policy_loss="cispo", clip_high=0.28)),
}


@pytest.mark.parametrize("case", list(KL))
def test_kl_in_the_loss_equals_trls_beta_without_its_bias_correction(case: str) -> None:
    """kl_coef with k3 in the loss = TRL's beta (its k3) with use_bias_correction_kl = False."""
    trl_settings, turnkeep_settings = KL[case]
    trl_loss, trl_grad, _ = _trl(reference=_reference(), beta=0.04, use_bias_correction_kl=False, **trl_settings)
    loss, grad, _, stats = _turnkeep(reference=_reference(), kl_coef=0.04, kl_estimator="k3", **turnkeep_settings)
    without_loss, _, _, _ = _turnkeep(**turnkeep_settings)
    assert stats.kl_reference > 1e-3 and abs((loss - without_loss).item()) > 1e-4, "the KL term counts"
    torch.testing.assert_close(loss, trl_loss, **TOLERANCE)
    torch.testing.assert_close(grad, trl_grad, **TOLERANCE)


@pytest.mark.parametrize("case", ["grpo", "dapo clip-higher"])
def test_kl_differs_by_trls_default_bias_correction(case: str) -> None:
    """TRL's default use_bias_correction_kl = True multiplies each token's KL estimate by its importance ratio r
    (with r's gradient); turnkeep's does not: (TRL - turnkeep) = beta x sum(weights x k3 x (r - 1)), and its
    gradient, computed here from that formula in float64."""
    trl_settings, turnkeep_settings = KL[case]
    trl_loss, trl_grad, _ = _trl(reference=_reference(), beta=0.04, **trl_settings)
    loss, grad, _, _ = _turnkeep(reference=_reference(), kl_coef=0.04, kl_estimator="k3", **turnkeep_settings)
    current, gen, _, mask = _batch()
    _, _, _, weights = _ratios_and_weights(**turnkeep_settings)
    logprobs = current.double().requires_grad_(True)
    d = (logprobs - _reference().double()) * mask
    gap = 0.04 * (weights * (torch.exp(-d) + d - 1.0) * (torch.exp((logprobs - gen.double()) * mask) - 1.0)).sum()
    gap.backward()
    assert abs(gap.item()) > 1e-5 and logprobs.grad.abs().max() > 1e-4, "the correction changes the loss"
    torch.testing.assert_close(trl_loss.double() - loss.double(), gap.detach(), **TOLERANCE)
    torch.testing.assert_close(trl_grad.double() - grad.double(), logprobs.grad, **TOLERANCE)
