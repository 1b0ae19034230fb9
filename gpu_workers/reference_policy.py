"""The frozen reference policy of `[algorithm] kl_coef`: a second copy of a causal LM (the run's starting weights, or
`algorithm.reference_path`) on the trainer's ranks, sharded over them like the policy, that only answers logprobs.
It holds no optimizer state and is in no checkpoint: a restore loads it again from its folder, which gives the same
weights, so the same loss."""

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
    def __init__(self, model_dir: Path, dtype: torch.dtype, device: torch.device, ranks: int, temperature: float,
                 autocast: Callable[[], contextlib.AbstractContextManager]) -> None:
        """Load the reference from `model_dir`, frozen; with `ranks` > 1 shard it over the group (a collective)."""
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        self.model.requires_grad_(False)
        self.model.eval()
        if ranks > 1:
            shard_model(self.model, device.type, ranks)
        self._device = device
        self._temperature = temperature
        self._autocast = autocast
        self._pad_id = self.model.config.pad_token_id or 0

    def logprobs(self, micro: PackedBatch) -> torch.Tensor:
        """The reference's logprobs of the micro-batch's tokens ([B, T-1], at the policy's sampling temperature)."""
        with torch.no_grad(), self._autocast():
            logits = self.model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
            return token_logprobs(logits.float(), micro.input_ids, temperature=self._temperature)

    def join(self) -> None:
        """A forward of one padding row: joins the other ranks' all-gathers when this rank has no rows left."""
        ids = torch.full((1, 2), self._pad_id, dtype=torch.long, device=self._device)
        with torch.no_grad(), self._autocast():
            self.model(input_ids=ids, attention_mask=torch.ones_like(ids))

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
