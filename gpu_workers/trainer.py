"""The trainer's compute: GRPO steps on a Hugging Face causal LM, plus its checkpoint state.

The optimizer step is the only moment that changes what a checkpoint or snapshot would
record, so `train_step` awaits the trainer hold right before every optimizer step; the
forward/backward work before it runs in a thread so the hold can be taken and released
while it computes.

Device: `train.device` (auto = CUDA when this process sees a GPU). The weights, the
gradients and the optimizer state live there; on CUDA with float32 weights the forward
and backward run under bfloat16 autocast (`train.autocast_bf16`). A batch is split into
micro-batches of `train.micro_batch_rows` rows whose gradients accumulate, the loss
normalised by the whole batch's token count so the step is the same as in one piece.
Checkpoints are written from and read back into device memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import time
from pathlib import Path

import orjson
import torch
from transformers import AutoModelForCausalLM

from gpu_workers.grpo import PackedBatch, build_batch, clipped_policy_loss, token_logprobs
from gpu_workers.weights_blob import OPTIONAL_NAMES, pack_state_dict
from primitives.atomic_files import atomic_write_bytes, atomic_write_json, fsync_tree
from primitives.hold_wait_clock import HoldWaitClock
from primitives.holds import HoldSet
from schemas.choices import Device
from schemas.config import TrainConfig
from schemas.rollout import RolloutRow

logger = logging.getLogger("turnkeep.trainer")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(wanted: str) -> torch.device:
    """`train.device` as a torch device; refuses CUDA where this process sees no GPU."""
    if wanted == Device.AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if wanted == Device.CUDA and not torch.cuda.is_available():
        raise RuntimeError('train.device = "cuda" but the trainer\'s process sees no GPU (CUDA_VISIBLE_DEVICES='
                           f'{os.environ.get("CUDA_VISIBLE_DEVICES")!r}); reserve one with placement.trainer_gpus')
    return torch.device(wanted)


class Trainer:
    def __init__(
        self, model_dir: Path, cfg: TrainConfig, dtype: str, seed: int, temperature: float, hold: HoldSet
    ) -> None:
        torch.manual_seed(seed)
        random.seed(seed)
        torch.set_num_threads(cfg.torch_threads)
        self._cfg = cfg
        # The policy server reports logprobs of the tempered distribution it sampled from.
        self._temperature = temperature
        self.device = resolve_device(cfg.device)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).to(self.device)
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            self.model.config.use_cache = False
        self.model.train()
        self.autocast = self.device.type == "cuda" and cfg.autocast_bf16 and DTYPES[dtype] == torch.float32
        self._pad_id = self.model.config.pad_token_id or 0
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.hold = hold
        self.hold_wait_clock = HoldWaitClock()
        self.policy_version = 0
        self.step = 0
        """The last train step committed here (the controller numbers steps; the policy version counts updates)."""

    async def train_step(self, rows: list[RolloutRow], step: int) -> dict:
        batch = build_batch(rows, self._pad_id).to(self.device)
        totals = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "grad_norm": 0.0, "hold_wait_s": 0.0}
        skipped = 0
        compute_s = 0.0
        for _ in range(self._cfg.passes_per_batch):
            started = time.monotonic()
            stats = await asyncio.to_thread(self._backward, batch)
            compute_s += time.monotonic() - started
            waited = time.monotonic()
            if not self.hold.is_clear():
                self.hold_wait_clock.waiting_since = waited
            await self.hold.wait_clear()
            self.hold_wait_clock.waiting_since = None
            totals["hold_wait_s"] += time.monotonic() - waited
            stats["grad_norm"], stepped = await asyncio.to_thread(self._optimizer_step)
            skipped += not stepped
            for key in ("loss", "clip_frac", "approx_kl", "grad_norm"):
                totals[key] += stats[key] / self._cfg.passes_per_batch
        self.policy_version += 1
        self.step = step
        return {**{k: round(v, 5) for k, v in totals.items()}, "compute_s": round(compute_s, 3),
                "nonfinite_steps_skipped": skipped,
                "policy_version": self.policy_version, "tokens": int(batch.loss_mask.sum())}

    def _backward(self, batch: PackedBatch) -> dict:
        """Accumulate the gradient of the whole batch, one micro-batch at a time."""
        total_tokens = max(batch.num_loss_tokens, 1)
        size = self._cfg.micro_batch_rows or len(batch.group_ids)
        loss_sum, clipped, kl = 0.0, 0.0, 0.0
        for start in range(0, len(batch.group_ids), size):
            micro = batch.rows(start, start + size)
            with self._autocast():
                logits = self.model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
            logprobs = token_logprobs(logits.float(), micro.input_ids, temperature=self._temperature)
            loss, stats = clipped_policy_loss(
                logprobs, micro.gen_logprobs, micro.advantages, micro.loss_mask, self._cfg.clip_eps,
                num_tokens=total_tokens,
            )
            loss.backward()
            loss_sum += loss.item()
            clipped += stats.clip_fraction * stats.num_tokens / total_tokens
            kl += stats.approx_kl * stats.num_tokens / total_tokens
        return {"loss": loss_sum, "clip_frac": clipped, "approx_kl": kl}

    def _autocast(self):
        if self.autocast:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _optimizer_step(self) -> tuple[float, bool]:
        """Clip and step; a non-finite gradient skips the update instead of poisoning the weights."""
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self._cfg.max_grad_norm))
        stepped = math.isfinite(norm)
        if stepped:
            self.optimizer.step()
        else:
            logger.warning("non-finite gradient norm (%s): the optimizer step is skipped", norm)
        self.optimizer.zero_grad(set_to_none=True)
        return (norm if stepped else 0.0), stepped

    def weights_blob(self, dtype: str | None = None) -> bytes:
        """The state dict as safetensors bytes, under the names the model directory uses, cast to `dtype`
        (the policy server's) on the device before it is copied to host memory."""
        return pack_state_dict(self.model.state_dict(), DTYPES[dtype] if dtype else None)

    def load_checkpoint(self, directory: Path, step: int) -> int:
        """Continue at train step `step` from `save_checkpoint`'s output: weights, optimizer moments, RNG and
        version; returns the version."""
        from safetensors.torch import load_file

        state = load_file(str(directory / "model.safetensors"), device=str(self.device))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [name for name in missing if name not in OPTIONAL_NAMES]
        if missing or unexpected:
            raise ValueError(
                f"trainer checkpoint {directory} does not fit this model (missing {missing[:5]}, unexpected "
                f"{unexpected[:5]}); restore with the model settings it was written with"
            )
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location=self.device,
                                                  weights_only=True))
        rng = torch.load(directory / "rng.pt", weights_only=True)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if self.device.type == "cuda" and rng.get("cuda") is not None:
            torch.cuda.set_rng_state(rng["cuda"], self.device)
        self.policy_version = int(orjson.loads((directory / "trainer_state.json").read_bytes())["policy_version"])
        self.step = step
        return self.policy_version

    def save_checkpoint(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(directory / "model.safetensors", self.weights_blob())
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
               "cuda": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None}
        torch.save(rng, directory / "rng.pt")
        atomic_write_json(directory / "trainer_state.json", {"policy_version": self.policy_version})
        fsync_tree(directory)
