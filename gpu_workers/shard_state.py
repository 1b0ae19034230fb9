"""A trainer rank's shard as bytes and back: its local pieces of the weights and of the AdamW state, and its RNG,
for the copies its keepers hold (`gpu_workers.rank_copies`).

The state dicts are torch's own (`get_state_dict` / `set_state_dict`, as a DCP checkpoint uses them); what is
copied is each tensor's local shard, so the bytes load only into a group of the same rank count, where every
rank's shards have the same shapes (FSDP2 splits each weight the same way every time).
"""

from __future__ import annotations

import io
import random

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor


class ShardMismatch(ValueError):
    """A copy that does not fit this rank's model (another model, rank count or LoRA setting)."""


def rng_state(device: torch.device) -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(rng: dict, device: torch.device) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if device.type == "cuda" and rng.get("cuda") is not None:
        torch.cuda.set_rng_state(rng["cuda"], device)


def shard_bytes(model, optimizer, options: StateDictOptions, device: torch.device, meta: dict) -> bytes:
    """This rank's shard of `model` and `optimizer` (each tensor's local piece, in host memory), its RNG and
    `meta`, serialised."""
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    payload = {"meta": meta, "model": _local(model_state), "optim": _local(optim_state), "rng": rng_state(device)}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def load_shard_bytes(model, optimizer, options: StateDictOptions, load_options: StateDictOptions,
                     device: torch.device, blob: bytes) -> dict:
    """`shard_bytes`'s output into this rank's model and optimizer, and its RNG; returns its `meta`."""
    payload = torch.load(io.BytesIO(blob), weights_only=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    _copy_into(model_state, payload["model"], "model")
    _copy_into(optim_state, payload["optim"], "optim")
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state,
                   options=load_options)
    set_rng_state(payload["rng"], device)
    return payload["meta"]


def _local(tree):
    if isinstance(tree, DTensor):
        return tree.to_local().detach().to("cpu", copy=True)
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {key: _local(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_local(value) for value in tree]
    return tree


def _copy_into(template: dict, saved: dict, where: str) -> None:
    """Each tensor of `saved` into the same tensor of `template` (in place: a DTensor's local shard), and the other
    values (the optimizer's param groups) taken as saved."""
    if set(template) != set(saved):
        extra, missing = sorted(map(str, set(saved) - set(template))), sorted(map(str, set(template) - set(saved)))
        raise ShardMismatch(f"the shard copy's {where} does not fit this rank's: {extra[:3]} only in the copy, "
                            f"{missing[:3]} only here")
    for key, value in saved.items():
        mine = template[key]
        if isinstance(mine, torch.Tensor):
            local = mine.to_local() if isinstance(mine, DTensor) else mine
            if local.shape != value.shape:
                raise ShardMismatch(f"the shard copy's {where}.{key} has shape {tuple(value.shape)}, this rank's "
                                    f"{tuple(local.shape)}")
            with torch.no_grad():
                local.copy_(value)
        elif isinstance(mine, dict):
            _copy_into(mine, value, f"{where}.{key}")
        else:
            template[key] = value
