"""The `[train]` table: the optimizer step, its batch and checkpoints, and where and across how many ranks the
trainer computes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from turnkeep.schemas.choices import Device
from turnkeep.schemas.config_base import StrictModel


class LoraConfig(StrictModel):
    rank: int | None = Field(default=None, ge=1)
    """LoRA's rank r (None: train every weight). With a rank the trainer trains low-rank adapters only (`peft`):
    checkpoints hold the adapters and their optimizer state, the base weights are reloaded from the model folder,
    and an export merges the adapters into them."""
    alpha: float = Field(default=16.0, gt=0)
    """LoRA's alpha: an adapter's update is scaled by alpha / rank."""
    target_modules: list[str] = Field(default=["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    """The linear layers that get adapters, by their name in the model (checked against the model's weights at
    start)."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapters' input during training."""
    refit: Literal["merged", "adapters"] = "merged"
    """What a refit sends the policy engines: the weights with the adapters merged in (`merged`: the engines run
    the plain model), or the adapters alone (`adapters`: the engines serve them as a vLLM LoRA)."""


class TrainConfig(StrictModel):
    prompts_per_step: int = Field(default=16, ge=1)
    """Complete groups consumed by one optimizer step."""
    lr: float = Field(default=1e-4, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    clip_eps: float = Field(default=0.2, gt=0, lt=1)
    """PPO-style clip of the ratio against generation logprobs."""
    passes_per_batch: int = Field(default=2, ge=1)
    """Forward/backward passes over the batch before the optimizer step's hold (accumulated)."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradient clipping norm."""
    max_staleness: int = Field(default=2, ge=0)
    """A group is trained only while its oldest turn is at most this many policy versions old."""
    save_period: int = Field(default=20, ge=1)
    """Write a trainer checkpoint every this many steps."""
    keep_checkpoints: int = Field(default=3, ge=1)
    """Trainer checkpoints kept on disk (oldest pruned)."""
    torch_threads: int = Field(default=1, ge=1)
    """torch intra-op threads in the trainer (the policy server needs the other cores)."""
    device: Device = Device.AUTO
    """Where the trainer computes: auto = CUDA when the trainer's process sees a GPU (placement.trainer_gpus),
    else the CPU. cuda without a visible GPU is refused at start."""
    autocast_bf16: bool = True
    """On CUDA, run forward and backward under bfloat16 autocast when the weights are float32 (the weights and
    the optimizer state stay float32). No effect on the CPU or for bfloat16/float16 weights."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them (less memory, about a third more compute)."""
    micro_batch_rows: int | None = Field(default=None, ge=1)
    """Rows per forward/backward; gradients accumulate over the step's batch (None: the whole batch at once)."""
    ranks: int = Field(default=1, ge=1, le=1024)
    """Trainer processes in one torch.distributed group (gloo on the CPU, NCCL on CUDA), placed by Ray: the model,
    its gradients and AdamW state are sharded across them with FSDP2 and each step's groups are split between them.
    A checkpoint written with one rank count restores with any other."""
    lora: LoraConfig = LoraConfig()
    """`[train.lora]`: train low-rank adapters instead of every weight (off unless `rank` is set)."""
    hang_s: float = Field(default=300.0, gt=0)
    """With several ranks: a collective that waits this long for a rank (frozen, or stuck in a kernel) fails on the
    ranks that wait, and the trainer's process kills its ranks by pid and exits, so the run rebuilds the group as
    after a rank's death. Set it above the longest wait between ranks: a step's slowest micro-batch, a model load
    and a checkpoint write included."""
    max_rebuilds: int = Field(default=3, ge=0)
    """A trainer (any of its ranks) that dies is replaced, and the run restores into the new one by itself, keeping
    its policy engines and environment servers. The run stops with one line only when this many rebuilds in a row
    end in another trainer death before a train step (0: a dead trainer stops the run, as before)."""
    rank_copies: bool | None = None
    """After every train step each rank's shard of the weights, AdamW state and RNG is copied into the host memory
    of two small processes (`shard_keeper.<r>`): its own node's and the next rank's. A trainer or rank that dies
    is rebuilt from these copies at the step it reached, so its death undoes no train step; only when both copies
    of a shard are gone (two nodes lost together) does the restore fall back to the newest checkpoint. Costs a
    copy of the shard per step and, per keeper, host memory for two shards (four while a step's copies arrive);
    `turnkeep bench ranks` measures both. None: on for a model of at most 64 MiB of weights (the tiny model), off
    above (SmolLM2-135M: 1.6 GB a copy and 26 s of a step on 2 cores)."""
