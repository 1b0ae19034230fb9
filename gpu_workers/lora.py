"""`[train.lora]`: the policy wrapped with `peft` LoRA adapters, and the two ways its weights leave the trainer: the
adapters merged into the base weights under the model's own names (what a refit sends the engines and what an
export writes), or the adapters alone under peft's names (what `PeftModel.from_pretrained` and vLLM's LoRA read).

A peft state dict names a base weight `base_model.model.<name>` (`...<layer>.base_layer.weight` where the layer has
an adapter) and its adapter `...<layer>.lora_A.<adapter>.weight` / `lora_B`; merged, the layer's weight is
W + (alpha / rank) x B @ A (LoRA, Hu et al., 2021)."""

from __future__ import annotations

import torch

from turnkeep.schemas.config_train import LoraConfig

PEFT_PREFIX = "base_model.model."
BASE = ".base_layer.weight"
ADAPTER = "default"
"""The adapter's name in the peft model (there is one)."""


def with_lora(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """`model` with LoRA adapters on `lora.target_modules`; only the adapters require grad."""
    # peft loads only where [train.lora] is set: a full fine-tune never imports it
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    config = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules),
                            lora_dropout=lora.dropout, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def scaling(lora: LoraConfig) -> float:
    return lora.alpha / lora.rank


def is_adapter_key(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def merged_state(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A peft model's full state dict as the base model's, each adapted layer's weight W + scale x B @ A."""
    base = {name.removeprefix(PEFT_PREFIX).replace(BASE, ".weight"): tensor for name, tensor in state.items()
            if not is_adapter_key(name)}
    return merge_into(base, {name: tensor for name, tensor in state.items() if is_adapter_key(name)}, scale)


def merge_into(base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor],
               scale: float) -> dict[str, torch.Tensor]:
    """The base model's weights (its own names) with peft-named adapters merged in (computed in float32, returned in
    each weight's dtype). Raises KeyError naming an adapter whose layer the base model has not."""
    merged = dict(base)
    for name, down in adapters.items():
        if ".lora_A." not in name:
            continue
        layer = name.split(".lora_A.")[0].removeprefix(PEFT_PREFIX)
        if layer + ".weight" not in merged:
            raise KeyError(f"an adapter for {layer}, a layer the model has not")
        weight = merged[layer + ".weight"]
        delta = scale * (adapters[name.replace(".lora_A.", ".lora_B.")].to(torch.float32) @ down.to(torch.float32))
        merged[layer + ".weight"] = (weight.to(torch.float32) + delta).to(weight.dtype)
    return merged


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters of a peft model's state dict, under the names `peft.save_pretrained` writes."""
    return {name.replace(f".{ADAPTER}.", "."): tensor for name, tensor in state.items() if is_adapter_key(name)}
