"""`[train.lora]` in the trainer: merged weights equal peft's own merge, the adapters carry peft's names and the shapes
the engine expects, only the adapters train, a checkpoint holds them alone and continues them exactly, and a
checkpoint of the other kind (LoRA against full weights) or a target the model lacks is refused in one line."""

from __future__ import annotations

import asyncio

import pytest
import torch
from peft import get_peft_model_state_dict

from tests.gpu_workers.synthetic_rows import synthetic_rows
from turnkeep.config.loader import ConfigError
from turnkeep.envs.calc_transcripts import CalcTranscripts
from turnkeep.gpu_workers.lora import adapter_state, merged_state, scaling, with_lora
from turnkeep.gpu_workers.tiny_model.build import ensure_tiny_model
from turnkeep.gpu_workers.trainer import Trainer
from turnkeep.gpu_workers.vllm_lora import adapter_shapes, engine_lora_args
from turnkeep.gpu_workers.weights_blob import checkpoint_shapes
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.config import ModelConfig, TaskConfig, TinyModelConfig, TrainConfig
from turnkeep.schemas.config_train import LoraConfig
from turnkeep.workers.startup_checks import check_lora_targets

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                       intermediate_size=128, max_position_embeddings=64, warm_start_steps=0)
LORA = LoraConfig(rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cfg = ModelConfig(cache_dir=tmp_path_factory.mktemp("models"), tiny=TINY)
    return ensure_tiny_model(cfg, CalcTranscripts(TaskConfig()), seed=0, eval_rollouts=0)


def _trainer(model_dir, lora: LoraConfig | None = LORA) -> Trainer:
    train = TrainConfig(lr=1e-2, passes_per_batch=1, lora=lora or LoraConfig())
    return Trainer(model_dir, train, "float32", seed=0, temperature=1.0, hold=HoldSet("trainer"))


def test_merged_weights_are_peft_merge_and_the_adapters_have_peft_names_and_the_engines_shapes(model_dir):
    from transformers import AutoModelForCausalLM

    model = with_lora(AutoModelForCausalLM.from_pretrained(model_dir), LORA)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.1)  # peft starts B at 0: the merge would change nothing
    merged = merged_state(model.state_dict(), scaling(LORA))
    adapters = adapter_state(model.state_dict())
    assert set(adapters) == set(get_peft_model_state_dict(model))
    assert {name: tuple(t.shape) for name, t in adapters.items()} == adapter_shapes(checkpoint_shapes(model_dir), LORA)
    expected = model.merge_and_unload().state_dict()
    assert set(merged) == set(expected)
    moved = 0
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, rtol=0, atol=1e-6, msg=name)
        moved += not torch.equal(tensor, AutoModelForCausalLM.from_pretrained(model_dir).state_dict()[name])
    assert moved == 2 * 4  # q, k, v and o of each of the two layers


def test_only_the_adapters_train_and_a_checkpoint_holds_them_alone_and_continues_them_exactly(model_dir, tmp_path):
    rows = synthetic_rows([24, 21, 18, 24])
    trainer = _trainer(model_dir)
    base = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if not p.requires_grad}
    for step in (1, 2):
        asyncio.run(trainer.train_step(rows, step))
    for name, parameter in trainer.model.named_parameters():
        if not parameter.requires_grad:
            assert torch.equal(parameter.detach(), base[name]), name
    asyncio.run(trainer.save_checkpoint(tmp_path / "lora"))
    import torch.distributed.checkpoint as dcp  # late: only this test reads a checkpoint's metadata

    keys = dcp.FileSystemReader(str(tmp_path / "lora" / "shards")).read_metadata().state_dict_metadata
    model_keys = [key for key in keys if key.startswith("model.")]
    assert model_keys and all(".lora_A." in key or ".lora_B." in key for key in model_keys)

    restored = _trainer(model_dir)
    asyncio.run(restored.load_checkpoint(tmp_path / "lora", step=2))
    assert restored.local.full_state().keys() == trainer.local.full_state().keys()
    after = [asyncio.run(t.train_step(rows, 3)) for t in (trainer, restored)]  # the AdamW moments came along
    assert after[1]["loss"] == after[0]["loss"] and after[1]["grad_norm"] == after[0]["grad_norm"]
    for name, tensor in trainer.local.full_state().items():
        assert torch.equal(restored.local.full_state()[name], tensor), name

    full = _trainer(model_dir, lora=None)
    with pytest.raises(ValueError) as refused:
        asyncio.run(full.load_checkpoint(tmp_path / "lora", step=2))
    assert ("was written with LoRA adapters (train.lora rank 4, alpha 8.0, target_modules ['q_proj', 'k_proj', "
            "'v_proj', 'o_proj']) and this run has full weights (no train.lora.rank)") in str(refused.value)


def test_a_target_the_model_lacks_and_a_rank_vllm_cannot_serve_are_refused_in_one_line(model_dir):
    check_lora_targets(model_dir, LORA)
    with pytest.raises(ConfigError) as refused:
        check_lora_targets(model_dir, LoraConfig(rank=4, target_modules=["q_proj", "query_key_value"]))
    assert str(refused.value).startswith("train.lora.target_modules ['query_key_value'] name no layer of the model")
    assert engine_lora_args(LoraConfig(rank=4))["max_lora_rank"] == 8
    with pytest.raises(ValueError, match="above vLLM's largest LoRA rank 512"):
        engine_lora_args(LoraConfig(rank=600))


def test_with_lora_the_reference_is_the_policys_own_base_with_its_adapters_off(model_dir):
    from turnkeep.schemas.config_algorithm import AlgorithmConfig

    rows = synthetic_rows([24, 21, 18, 24])
    train = TrainConfig(lr=1e-2, passes_per_batch=1, lora=LORA)
    algorithm = AlgorithmConfig(kl_coef=0.1).resolved(train.clip_eps, 32)
    trainer = Trainer(model_dir, train, "float32", seed=0, temperature=1.0, hold=HoldSet("trainer"),
                      algorithm=algorithm)
    assert trainer.local.reference.model is trainer.model  # no second copy of the model
    assert asyncio.run(trainer.train_step(rows, 1))["kl_reference"] == pytest.approx(0.0, abs=1e-7)
    assert asyncio.run(trainer.train_step(rows, 2))["kl_reference"] > 0  # the adapters moved the policy off it
