"""The frozen reference policy of `[algorithm] kl_coef`: a second copy of a causal LM (the run's starting weights, or
`algorithm.reference_path`) on the trainer's ranks, sharded over them like the policy, that only answers logprobs.
It holds no optimizer state and is in no checkpoint: a restore loads it again from its folder, which gives the same
weights, so the same loss. With `[train.lora]` and no `reference_path` the reference is the policy's own frozen base
with its adapters switched off (peft's `disable_adapter`): no second copy."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM

from turnkeep.gpu_workers.grpo import PackedBatch, token_logprobs
from turnkeep.gpu_workers.policy_loss import kl_estimate
from turnkeep.gpu_workers.sharding import shard_model


class ReferencePolicy:
    def __init__(self, model: torch.nn.Module, device: torch.device, temperature: float,
                 autocast: Callable[[], contextlib.AbstractContextManager], adapters_off: bool = False) -> None:
        """`model`: a frozen copy (`load`), or with `adapters_off` the LoRA policy itself, read with its adapters
        switched off."""
        self.model = model
        self._adapters_off = adapters_off
        self._device = device
        self._temperature = temperature
        self._autocast = autocast
        self._pad_id = self.model.config.pad_token_id or 0

    @classmethod
    def load(cls, model_dir: Path, dtype: torch.dtype, device: torch.device, ranks: int, temperature: float,
             autocast: Callable[[], contextlib.AbstractContextManager]) -> ReferencePolicy:
        """The reference loaded from `model_dir`, frozen; with `ranks` > 1 sharded over the group (a collective)."""
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        model.requires_grad_(False)
        model.eval()
        if ranks > 1:
            shard_model(model, device.type, ranks)
        return cls(model, device, temperature, autocast)

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        off = self.model.disable_adapter() if self._adapters_off else contextlib.nullcontext()
        with torch.no_grad(), self._autocast(), off:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def logprobs(self, micro: PackedBatch) -> torch.Tensor:
        """The reference's logprobs of the micro-batch's tokens ([B, T-1], at the policy's sampling temperature)."""
        logits = self._forward(micro.input_ids, micro.attention_mask)
        return token_logprobs(logits.float(), micro.input_ids, temperature=self._temperature)

    def join(self) -> None:
        """A forward of one padding row: joins the other ranks' all-gathers when this rank has no rows left."""
        ids = torch.full((1, 2), self._pad_id, dtype=torch.long, device=self._device)
        self._forward(ids, torch.ones_like(ids))

    def row_kl(self, batch: PackedBatch | None, micro_batches: int, estimator: str) -> tuple[list[float], int]:
        """(per row, the sum over its generated tokens of the KL estimate of the policy that generated it against
        the reference; the tokens counted) in exactly `micro_batches` forwards, the same count on every rank."""
        rows = len(batch.group_ids) if batch is not None else 0
        size = max(-(-rows // micro_batches), 1)
        sums: list[float] = []
        tokens = 0
        for index in range(micro_batches):
            if batch is None or index * size >= rows:
                self.join()
                continue
            micro = batch.rows(index * size, (index + 1) * size).to(self._device)
            keep = micro.loss_mask.to(torch.bool)
            log_ratio = torch.where(keep, micro.gen_logprobs - self.logprobs(micro), 0.0)
            sums.extend((kl_estimate(log_ratio, estimator) * keep).sum(dim=-1).tolist())
            tokens += int(keep.sum().item())
        return sums, tokens
