"""The policy served as a LoRA adapter on the engine's base model (`[train.lora] refit = "adapters"`): a refit
carries the adapters alone (tens of KiB instead of the model), written as a peft adapter folder private to the
engine and loaded in place under one adapter id that every request names.

vLLM's CPU engine serves LoRA (its punica CPU wrapper); measured against transformers with the adapters merged,
the sampled tokens' logprobs agree to 2e-5. One id, loaded in place, never evicted (`max_loras` = 1): a request
naming an id the engine has dropped kills the engine core. The engine pauses for the load as for a full refit
(`vllm_refit.refit_engine`), so no request straddles two versions; the prefix cache is cleared, since its blocks
were computed with the old adapters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from turnkeep.gpu_workers.lora import PEFT_PREFIX
from turnkeep.gpu_workers.tiny_model.model_files import is_target
from turnkeep.gpu_workers.weights_blob import Shapes
from turnkeep.schemas.config_train import LoraConfig

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `max_lora_rank` values vLLM accepts."""
ADAPTER_NAME, ADAPTER_ID = "policy", 1


def engine_lora_args(lora: LoraConfig) -> dict[str, Any]:
    """vLLM engine arguments that make room for one adapter of `lora.rank`."""
    rank = next((allowed for allowed in VLLM_LORA_RANKS if allowed >= lora.rank), None)
    if rank is None:
        raise ValueError(f"train.lora.rank = {lora.rank} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}; "
                         "lower it, or set train.lora.refit = \"merged\"")
    return {"enable_lora": True, "max_loras": 1, "max_lora_rank": rank}


def adapter_config(lora: LoraConfig) -> dict[str, Any]:
    """The adapter_config.json peft writes for these adapters (what vLLM reads)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
            "target_modules": sorted(lora.target_modules), "lora_dropout": 0.0, "bias": "none",
            "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "modules_to_save": None}


def adapter_shapes(base: Shapes | None, lora: LoraConfig) -> Shapes | None:
    """The names and shapes an adapter blob must have for a base model with these weights (None: unknown)."""
    if base is None:
        return None
    shapes: Shapes = {}
    for name, shape in base.items():
        layer = name.removesuffix(".weight")
        if layer == name or len(shape) != 2 or not is_target(layer, list(lora.target_modules)):
            continue
        out_features, in_features = shape
        shapes[f"{PEFT_PREFIX}{layer}.lora_A.weight"] = (lora.rank, in_features)
        shapes[f"{PEFT_PREFIX}{layer}.lora_B.weight"] = (out_features, lora.rank)
    return shapes


async def refit_adapter(engine: Any, folder: Path, blob: bytes, lora: LoraConfig) -> Any:
    """Write the adapters into `folder` (renamed into place), then pause the engine, load them in place
    under the one adapter id, clear caches and resume; returns the `LoRARequest` requests must name."""
    from vllm.lora.request import LoRARequest  # vLLM only inside the engine's process

    _write_renamed(folder / "adapter_config.json", orjson.dumps(adapter_config(lora)))
    _write_renamed(folder / "adapter_model.safetensors", blob)
    request = LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(folder), load_inplace=True)
    await engine.pause_generation(mode="wait", clear_cache=True)
    try:
        if not await engine.add_lora(request):
            raise RuntimeError(f"the engine refused the adapters in {folder}")
    finally:
        await engine.resume_generation()
    return request


def _write_renamed(path: Path, data: bytes) -> None:
    """Whole or not at all, for the engine reading it; not fsynced: the folder is the engine's scratch, which no
    restart reads (a new engine gets the adapters again from the trainer)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)
