"""The trainer on whatever device this machine has (the CPU here): micro-batches add up to
the whole batch, a non-finite gradient never reaches the weights, checkpoints round-trip."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from tests.gpu_workers.synthetic_rows import synthetic_rows
from turnkeep.envs.calc_transcripts import CalcTranscripts
from turnkeep.gpu_workers.grpo import build_batch, token_logprobs
from turnkeep.gpu_workers.tiny_model.build import ensure_tiny_model
from turnkeep.gpu_workers.trainer import Trainer, resolve_device
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.config import ModelConfig, TaskConfig, TinyModelConfig, TrainConfig
from turnkeep.schemas.config_algorithm import AlgorithmConfig
from turnkeep.schemas.rollout import RolloutRow

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                       intermediate_size=128, max_position_embeddings=64, warm_start_steps=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cfg = ModelConfig(cache_dir=tmp_path_factory.mktemp("models"), tiny=TINY)
    return ensure_tiny_model(cfg, CalcTranscripts(TaskConfig()), seed=0, eval_rollouts=0)


def _trainer(model_dir, algorithm: dict | None = None, **train) -> Trainer:
    settings = AlgorithmConfig(**(algorithm or {})).resolved(TrainConfig(**train).clip_eps, 32)
    return Trainer(model_dir, TrainConfig(**train), "float32", seed=0, temperature=1.0, hold=HoldSet("trainer"),
                   algorithm=settings)


def _rows(count: int = 4, length: int = 24) -> list[RolloutRow]:
    # Unequal lengths: the batch is padded, micro-batches are cut.
    return synthetic_rows([length - 3 * (i % 3) for i in range(count)])


def _gradients(trainer: Trainer, rows: list[RolloutRow]) -> dict[str, torch.Tensor]:
    batch = build_batch(rows, 0, algorithm=trainer._algorithm)
    passes = -(-len(rows) // trainer._cfg.micro_batch_rows) if trainer._cfg.micro_batch_rows else 1
    trainer.local.backward(batch, batch.num_loss_tokens, passes, len(rows))
    grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters()}
    trainer.model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("algorithm", [
    {},
    {"advantage": "grpo", "scale_rewards": "group", "loss_agg": "seq_mean_token_mean", "clip_high": 0.28},
    {"policy_loss": "cispo", "importance_level": "sequence", "loss_agg": "constant", "entropy_coef": 0.01},
    {"advantage": "reinforce_pp", "loss_agg": "seq_mean_token_sum", "dual_clip": 3.0},
    {"tis_cap": 2.0, "loss_agg": "seq_mean_token_mean"},
    {"kl_coef": 0.5, "kl_estimator": "k2", "loss_agg": "seq_mean_token_sum"},
], ids=["default", "grpo-seq-mean", "cispo-gspo-entropy", "reinforce-pp-dual-clip", "tis", "kl-loss"])
def test_micro_batches_accumulate_to_the_whole_batch_gradient(model_dir, algorithm):
    whole = _gradients(_trainer(model_dir, algorithm), _rows())
    split = _gradients(_trainer(model_dir, algorithm, micro_batch_rows=1), _rows())
    assert any(grad.abs().sum() > 0 for grad in whole.values())
    for name, grad in whole.items():
        torch.testing.assert_close(split[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_truncated_importance_sampling_reports_the_engine_trainer_mismatch(model_dir):
    rows = _rows()
    plain = asyncio.run(_trainer(model_dir).train_step(rows, 1))
    assert "engine_mismatch_mean" not in plain
    stats = asyncio.run(_trainer(model_dir, {"tis_cap": 2.0}, passes_per_batch=2).train_step(rows, 1))
    # The engine's logprobs here are a made-up -1.5 for every token: the trainer's own differ from them.
    assert 0 < stats["engine_mismatch_mean"] <= stats["engine_mismatch_max"]
    trainer = _trainer(model_dir, {"tis_cap": 2.0})
    batch = build_batch(rows, 0, algorithm=trainer._algorithm)
    trainer.local.backward(batch, batch.num_loss_tokens, 1, len(rows))
    with torch.no_grad():
        logits = trainer.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    expected = token_logprobs(logits, batch.input_ids)  # the proximal logprobs: the trainer's before the update
    torch.testing.assert_close(trainer.local._proximal[0], expected, rtol=1e-5, atol=1e-5)


def test_the_reference_starts_as_the_policy_is_reloaded_not_checkpointed_and_gives_the_same_loss(model_dir, tmp_path):
    rows = _rows()
    trainer = _trainer(model_dir, {"kl_coef": 0.1}, passes_per_batch=1)
    batch = build_batch(rows, 0, algorithm=trainer._algorithm)
    with torch.no_grad():
        logits = trainer.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    torch.testing.assert_close(trainer.local.reference.logprobs(batch), token_logprobs(logits, batch.input_ids))
    first = asyncio.run(trainer.train_step(rows, 1))
    assert first["kl_reference"] == pytest.approx(0.0, abs=1e-6)  # step 0's policy is the reference: KL 0
    assert asyncio.run(trainer.train_step(rows, 2))["kl_reference"] > 0
    asyncio.run(trainer.save_checkpoint(tmp_path / "kl"))
    plain = _trainer(model_dir)
    asyncio.run(plain.save_checkpoint(tmp_path / "plain"))
    assert _checkpoint_keys(tmp_path / "kl") == _checkpoint_keys(tmp_path / "plain")  # no reference tensor in it

    restored = _trainer(model_dir, {"kl_coef": 0.1})
    asyncio.run(restored.load_checkpoint(tmp_path / "kl", step=2))
    losses = [t.local.backward(batch, batch.num_loss_tokens, 1, len(rows)) for t in (trainer, restored)]
    assert losses[0]["kl_reference"] > 0
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_kl_in_the_reward_takes_each_rows_kl_from_its_reward_before_the_advantages(model_dir):
    rows = _rows()
    trainer = _trainer(model_dir, {"kl_coef": 0.5, "kl_in": "reward", "kl_estimator": "k1"})
    batch = build_batch(rows, 0, algorithm=trainer._algorithm)
    sums, tokens = trainer.local.reference_kl(batch, 2)
    # k1 of the made-up engine logprobs (-1.5) against the reference's, over each row's generated tokens
    assert len(sums) == len(rows) and tokens == batch.num_loss_tokens and len(set(sums)) > 1
    shaped = build_batch(rows, 0, algorithm=trainer._algorithm, reward_shaping=[-0.5 * kl for kl in sums])
    stats = asyncio.run(trainer.train_step(rows, 1))
    assert stats["kl_reference"] == pytest.approx(sum(sums) / tokens, rel=1e-5)
    assert not torch.allclose(shaped.advantages, batch.advantages)
    plain = build_batch(rows, 0, algorithm=AlgorithmConfig())
    sibling_kl = torch.tensor([sums[i ^ 1] for i in range(len(sums))])  # groups of two: the leave-one-out baseline
    expected = plain.advantages - 0.5 * (torch.tensor(sums) - sibling_kl)
    torch.testing.assert_close(shaped.advantages, expected, rtol=1e-5, atol=1e-5)


def _checkpoint_keys(directory) -> set[str]:
    import torch.distributed.checkpoint as dcp  # late: only these tests read a checkpoint's metadata
    return set(dcp.FileSystemReader(str(directory / "shards")).read_metadata().state_dict_metadata)


def test_a_non_finite_gradient_skips_the_optimizer_step_and_leaves_the_weights(model_dir):
    trainer = _trainer(model_dir)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    batch = build_batch(_rows(), 0)
    trainer.local.backward(batch, batch.num_loss_tokens, 1)
    next(trainer.model.parameters()).grad[0, 0] = math.nan
    norm, stepped = trainer.local.optimizer_step()
    assert not stepped and norm == 0.0
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
    stats = asyncio.run(trainer.train_step(_rows(), 1))  # the next, finite step trains again
    assert stats["nonfinite_steps_skipped"] == 0 and stats["grad_norm"] > 0


def test_a_checkpoint_loads_back_weights_optimizer_and_rng_with_weights_only(model_dir, tmp_path):
    trainer = _trainer(model_dir)
    asyncio.run(trainer.train_step(_rows(), 1))
    asyncio.run(trainer.save_checkpoint(tmp_path / "trainer"))
    saved = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    moments = {k: v.clone() for k, v in trainer.local.optimizer.state_dict()["state"][0].items() if torch.is_tensor(v)}
    expected_draw = torch.rand(3)

    other = _trainer(model_dir)
    assert asyncio.run(other.load_checkpoint(tmp_path / "trainer", step=1)) == 1 and other.step == 1
    for name, p in other.model.named_parameters():
        assert torch.equal(p.detach(), saved[name]), name
    for key, value in other.local.optimizer.state_dict()["state"][0].items():
        if torch.is_tensor(value):
            assert torch.equal(value, moments[key]), key
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues where the checkpoint left it


def test_cuda_is_refused_where_no_gpu_is_visible():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")  # not counted: the CPU machines that run the suite have none
    with pytest.raises(RuntimeError, match="placement.trainer_gpus"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"
