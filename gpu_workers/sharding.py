"""FSDP2 sharding of a Hugging Face causal LM over the trainer's group (the policy and the frozen reference alike):
each decoder layer, then the root, so each rank holds 1/N of every weight."""

from __future__ import annotations

import torch


def shard_model(model: torch.nn.Module, device_type: str, ranks: int) -> None:
    """Shard `model` in place over the group this process belongs to (a collective: every rank at once)."""
    # only a group of ranks shards: a single rank never loads FSDP
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    if dist.get_world_size() != ranks:
        raise ValueError(f"the group has {dist.get_world_size()} ranks, the model is to be sharded over {ranks}")
    # The mesh over the group itself, not a new one: its collectives keep the group's timeout (`train.hang_s`),
    # where init_device_mesh's new group would wait torch's default 30 minutes for a frozen rank.
    mesh = DeviceMesh.from_group(dist.group.WORLD, device_type)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks FSDP2 shards one by one (Hugging Face causal LMs keep them in `model.layers`, a peft
    model one level further down); a model without them is sharded as one unit."""
    inner = getattr(model, "model", None)
    for _ in range(3):
        layers = getattr(inner, "layers", None)
        if isinstance(layers, torch.nn.ModuleList):
            return list(layers)
        inner = getattr(inner, "model", None)
    return []
