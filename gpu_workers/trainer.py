"""The trainer's compute: GRPO steps on a Hugging Face causal LM, plus its checkpoint state.

The optimizer step is the only moment that changes what a checkpoint or snapshot would
record, so `train_step` awaits the trainer hold right before every optimizer step; the
forward/backward work before it runs in a thread so the hold can be taken and released
while it computes.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import orjson
import torch
from transformers import AutoModelForCausalLM

from gpu_workers.grpo import build_batch, clipped_policy_loss, token_logprobs
from gpu_workers.weights_blob import OPTIONAL_NAMES, pack_state_dict
from primitives.atomic_files import atomic_write_bytes, atomic_write_json, fsync_tree
from primitives.hold_wait_clock import HoldWaitClock
from primitives.holds import HoldSet
from schemas.config import TrainConfig
from schemas.rollout import RolloutRow

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
        self.model.train()
        self._pad_id = self.model.config.pad_token_id or 0
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.hold = hold
        self.hold_wait_clock = HoldWaitClock()
        self.policy_version = 0
        self.step = 0
        """The last train step committed here (the controller numbers steps; the policy version counts updates)."""

    async def train_step(self, rows: list[RolloutRow], step: int) -> dict:
        batch = build_batch(rows, self._pad_id)
        totals = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "grad_norm": 0.0, "hold_wait_s": 0.0}
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
            stats["grad_norm"] = await asyncio.to_thread(self._optimizer_step)
            for key in ("loss", "clip_frac", "approx_kl", "grad_norm"):
                totals[key] += stats[key] / self._cfg.passes_per_batch
        self.policy_version += 1
        self.step = step
        return {**{k: round(v, 5) for k, v in totals.items()}, "compute_s": round(compute_s, 3),
                "policy_version": self.policy_version, "tokens": int(batch.loss_mask.sum())}

    def _backward(self, batch) -> dict:
        logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logprobs = token_logprobs(logits.float(), batch.input_ids, temperature=self._temperature)
        loss, stats = clipped_policy_loss(
            logprobs, batch.gen_logprobs, batch.advantages, batch.loss_mask, self._cfg.clip_eps
        )
        loss.backward()
        return {"loss": loss.item(), "clip_frac": stats.clip_fraction, "approx_kl": stats.approx_kl}

    def _optimizer_step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self._cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def weights_blob(self) -> bytes:
        """The state dict as safetensors bytes, under the names the model directory uses."""
        return pack_state_dict(self.model.state_dict())

    def load_checkpoint(self, directory: Path, step: int) -> int:
        """Continue at train step `step` from `save_checkpoint`'s output: weights, optimizer moments, RNG and
        version; returns the version."""
        from safetensors.torch import load_file

        state = load_file(str(directory / "model.safetensors"))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [name for name in missing if name not in OPTIONAL_NAMES]
        if missing or unexpected:
            raise ValueError(
                f"trainer checkpoint {directory} does not fit this model (missing {missing[:5]}, unexpected "
                f"{unexpected[:5]}); restore with the model settings it was written with"
            )
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=False))
        rng = torch.load(directory / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        self.policy_version = int(orjson.loads((directory / "trainer_state.json").read_bytes())["policy_version"])
        self.step = step
        return self.policy_version

    def save_checkpoint(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(directory / "model.safetensors", self.weights_blob())
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, directory / "rng.pt")
        atomic_write_json(directory / "trainer_state.json", {"policy_version": self.policy_version})
        fsync_tree(directory)
