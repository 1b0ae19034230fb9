"""A LoRA run end to end (`[train.lora] rank = 8, refit = "adapters"`, the tiny model, real vLLM): every refit
carries the adapters alone, which the engine serves as a vLLM LoRA; the checkpoints hold the adapters alone; the
same command continued to step 5 restores them and trains them on (not fresh ones); the export merges them into
the base weights and loads in transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.run_command import metrics, short_run_dir, small_run_settings, turnkeep
from turnkeep.chaos.verdict import check_run_dir
from turnkeep.gpu_workers.hf_export import read_model_state
from turnkeep.gpu_workers.vllm_lora import adapter_shapes
from turnkeep.gpu_workers.weights_blob import checkpoint_shapes
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.config_train import LoraConfig
from turnkeep.workers.export import export_checkpoint
from turnkeep.workers.model_maker import tiny_model_dir

pytestmark = pytest.mark.integration
RANK, ALPHA = 8, 16.0


def _run(stack_config, run_dir: Path, steps: int) -> None:
    log = run_dir.parent / "run.log"
    code = turnkeep("run", *small_run_settings(stack_config), "--set", f"run.run_dir={run_dir}",
                    "--set", f"run.steps={steps}", "--set", "train.save_period=3", "--set", f"train.lora.rank={RANK}",
                    "--set", f"train.lora.alpha={ALPHA}", "--set", "train.lora.refit=adapters", log=log).wait(900)
    assert code == 0, log.read_text()[-4000:]


def _adapters(run_dir: Path, step: int, kind: str) -> dict[str, torch.Tensor]:
    state = read_model_state(run_dir / "checkpoints" / f"step_{step}" / "trainer" / "shards")
    assert state and all(".lora_A." in name or ".lora_B." in name for name in state)
    return {name: tensor for name, tensor in state.items() if f".lora_{kind}." in name}


def test_a_lora_run_refits_adapters_only_restores_them_and_exports_them_merged(stack_config, tmp_path) -> None:
    run_dir = short_run_dir("tk-lora-")
    _run(stack_config, run_dir, 3)
    folder = tiny_model_dir(TurnkeepConfig.model_validate_json((run_dir / "config.json").read_bytes()))
    shapes = adapter_shapes(checkpoint_shapes(folder), LoraConfig(rank=RANK, alpha=ALPHA))
    adapter_bytes = sum(4 * a * b for a, b in shapes.values())
    steps = metrics(run_dir, "train_step")
    assert [line["step"] for line in steps] == [1, 2, 3]
    # safetensors adds a header to the tensors' float32 bytes; the whole model is many times larger
    assert all(adapter_bytes < line["refit_bytes"] < adapter_bytes + 8192 for line in steps), steps
    assert adapter_bytes * 5 < sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    up_at_3 = _adapters(run_dir, 3, "B")

    _run(stack_config, run_dir, 5)
    assert [line["step"] for line in metrics(run_dir, "train_step")] == [1, 2, 3, 4, 5]
    up_at_5 = _adapters(run_dir, 5, "B")
    # Continued, B (zero at the start) has grown past step 3's; started afresh it would hold two steps' worth only.
    assert _norm(up_at_5) > _norm(up_at_3) > 0
    verdict = check_run_dir(run_dir)
    assert verdict.ok, verdict.format()

    exported = export_checkpoint(run_dir, tmp_path / "hf")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(exported.folder).state_dict()
    base = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    down = _adapters(run_dir, 5, "A")
    for name, up in up_at_5.items():
        layer = name.split(".lora_B.")[0].removeprefix("base_model.model.")
        delta = (ALPHA / RANK) * up @ down[name.replace(".lora_B.", ".lora_A.")]
        torch.testing.assert_close(merged[layer + ".weight"], base[layer + ".weight"] + delta, rtol=0, atol=1e-6)


def _norm(state: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(tensor.float().square().sum() for tensor in state.values())))
