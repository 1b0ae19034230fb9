"""The torch side of a trainer rank (`RankCompute`), in whichever process hosts the rank (the trainer's own for
rank 0, a `gpu_workers.rank_actor.TrainerRankActor` for the others): its shard of the model and of the AdamW state,
the backward pass over its share of a step's rows, the optimizer step, and its part of a checkpoint.

With one rank the model is a plain module. With several, every rank joins one torch.distributed group first
(`gpu_workers.rank_group`) and the model is sharded with FSDP2 (`fully_shard`: each decoder layer, then the
root), so weights, gradients and optimizer moments are split between the ranks. Every call that runs collectives
(`backward`, `optimizer_step`, `full_state`, `save`, `load`) must be made on every rank at once, the same number
of times: the group's coordinator (`gpu_workers.trainer.Trainer`) makes each one on all ranks.

Checkpoints are `torch.distributed.checkpoint` (DCP) folders: each rank writes its own shard file and the
coordinator the metadata, which records every tensor's global shape, so a checkpoint written by N ranks loads into
M (DCP reshards on load). Each rank's RNG state goes beside it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from transformers import AutoModelForCausalLM

from turnkeep.gpu_workers.grpo import PackedBatch, token_logprobs
from turnkeep.gpu_workers.lora import adapter_state, merged_state, scaling, with_lora
from turnkeep.gpu_workers.policy_loss import policy_loss, token_entropy, token_weights
from turnkeep.gpu_workers.reference_policy import ReferencePolicy
from turnkeep.gpu_workers.shard_state import load_shard_bytes, rng_state, set_rng_state, shard_bytes
from turnkeep.gpu_workers.sharding import shard_model
from turnkeep.schemas.choices import Device
from turnkeep.schemas.config import TrainConfig
from turnkeep.schemas.config_algorithm import AlgorithmConfig

logger = logging.getLogger("turnkeep.trainer")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHARDS = "shards"
"""The DCP folder inside a checkpoint's `trainer/` folder."""
RNG = "rng"
"""Each rank's RNG state: `rng/rank_<r>.pt`."""


def resolve_device(wanted: str) -> torch.device:
    """`train.device` as a torch device; refuses CUDA where this process sees no GPU."""
    if wanted == Device.AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if wanted == Device.CUDA and not torch.cuda.is_available():
        raise RuntimeError('train.device = "cuda" but the trainer\'s process sees no GPU (CUDA_VISIBLE_DEVICES='
                           f'{os.environ.get("CUDA_VISIBLE_DEVICES")!r}); reserve one with placement.trainer_gpus')
    return torch.device(wanted)


def world() -> tuple[int, int]:
    """(this process's rank, the group's size); (0, 1) outside a group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class RankCompute:
    def __init__(self, model_dir: Path, cfg: TrainConfig, dtype: str, seed: int, temperature: float,
                 algorithm: AlgorithmConfig | None = None) -> None:
        """`algorithm`: resolved `[algorithm]` settings (None: the defaults, clipped at train.clip_eps)."""
        self.rank, self.ranks = world()
        self._algorithm = algorithm or AlgorithmConfig().resolved(cfg.clip_eps, 1)
        # Every rank starts from the same weights (the model directory) but draws its own random numbers.
        torch.manual_seed(seed + self.rank)
        random.seed(seed + self.rank)
        torch.set_num_threads(cfg.torch_threads)
        self._cfg = cfg
        # The policy server reports logprobs of the tempered distribution it sampled from.
        self._temperature = temperature
        self.device = resolve_device(cfg.device)
        if self.device.type == "cuda" and self.ranks > 1:
            torch.cuda.set_device(self.device)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).to(self.device)
        self.lora = cfg.lora if cfg.lora.rank else None
        if self.lora:
            self.model = with_lora(self.model, self.lora)
        # With LoRA, checkpoints hold the adapters and their optimizer state; the frozen base is the model folder's.
        self._state_options = StateDictOptions(ignore_frozen_params=self.lora is not None)
        # With LoRA the frozen base is not in a checkpoint or copy (whose load refuses a missing adapter itself).
        self._load_options = StateDictOptions(ignore_frozen_params=self.lora is not None, strict=self.lora is None)
        self.copies = None
        """Its way to the keepers of its shard's copies (`gpu_workers.rank_copies.CopySink`), set by the process
        that hosts the rank when `train.rank_copies` is on; None: no copies."""
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            self.model.config.use_cache = False
            if self.lora:
                self.model.enable_input_require_grads()  # the frozen embeddings' output must carry a gradient
        if self.ranks > 1:
            shard_model(self.model, self.device.type, self.ranks)
        self.model.train()
        self.autocast = self.device.type == "cuda" and cfg.autocast_bf16 and DTYPES[dtype] == torch.float32
        self.pad_id = self.model.config.pad_token_id or 0
        trained = [parameter for parameter in self.model.parameters() if parameter.requires_grad]
        self.optimizer = torch.optim.AdamW(trained, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self._proximal: list[torch.Tensor] = []
        """With `algorithm.tis_cap`: each micro-batch's logprobs before the step's update (its first pass)."""
        self.reference = None
        if self._algorithm.kl_coef and self.lora and self._algorithm.reference_path is None:
            self.reference = ReferencePolicy(self.model, self.device, temperature, self._autocast, adapters_off=True)
        elif self._algorithm.kl_coef:
            self.reference = ReferencePolicy.load(Path(self._algorithm.reference_path or model_dir), DTYPES[dtype],
                                                  self.device, self.ranks, temperature, self._autocast)
        self._reference_in_loss = self.reference is not None and self._algorithm.kl_in == "loss"
        self._reference_lps: list[torch.Tensor] = []
        """With the KL in the loss: each micro-batch's reference logprobs (computed in the step's first pass)."""

    def backward(self, batch: PackedBatch | None, total_tokens: int, micro_batches: int,
                 total_rows: int | None = None, first_pass: bool = True) -> dict:
        """Accumulate this rank's share of the step's gradient in exactly `micro_batches` forward/backward passes
        (the same count on every rank: each pass gathers and reduces shards with the others). The loss is
        normalised by the whole step's token count, over every rank, so the summed gradient is the one-rank one.
        A rank with fewer rows than passes runs the rest on a masked-out row, contributing nothing. `total_rows`:
        the step's rows over every rank (the per-sequence aggregations divide by it); `first_pass`: the step's
        first pass over its batch (with `algorithm.tis_cap`, it computes the proximal logprobs the others reuse)."""
        total_tokens = max(total_tokens, 1)
        total_rows = total_rows or 1
        rows = len(batch.group_ids) if batch is not None else 0
        size = max(math.ceil(rows / micro_batches), 1)
        proximal = self._algorithm.tis_cap is not None
        if first_pass:
            self._proximal, self._reference_lps = [], []
        sums = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "engine_mismatch_mean": 0.0,
                "engine_mismatch_max": 0.0, "kl_reference": 0.0}
        for index in range(micro_batches):
            if batch is None or index * size >= rows:
                if first_pass:
                    self._join_before_update()
                self._empty_pass()
                continue
            micro = batch.rows(index * size, (index + 1) * size).to(self.device)
            if first_pass:
                self._remember_before_update(micro)
            reference = self._reference_lps[index] if self._reference_in_loss else None
            loss, stats, mismatch = self._micro_loss(micro, self._proximal[index] if proximal else None, reference,
                                                     total_rows, total_tokens)
            # FSDP2 averages the ranks' gradients; each rank's loss is a share of the step's (normalised by the
            # whole step's token count), so the shares must add up instead: scaled here, since gloo has no
            # pre-multiplied sum for FSDP2's divide factor.
            (loss * self.ranks).backward()
            sums["loss"] += loss.item()
            sums["clip_frac"] += stats.clip_fraction * stats.num_tokens / total_tokens
            sums["approx_kl"] += stats.approx_kl * stats.num_tokens / total_tokens
            sums["kl_reference"] += stats.kl_reference * stats.num_tokens / total_tokens
            if mismatch is not None:
                sums["engine_mismatch_mean"] += mismatch[0] / total_tokens
                sums["engine_mismatch_max"] = max(sums["engine_mismatch_max"], mismatch[1])
        if not proximal:
            del sums["engine_mismatch_mean"], sums["engine_mismatch_max"]
        if not self._reference_in_loss:
            del sums["kl_reference"]
        return sums

    def _remember_before_update(self, micro: PackedBatch) -> None:
        """What the step's later passes reuse, computed before its update: the proximal and reference logprobs."""
        if self._algorithm.tis_cap is not None:
            self._proximal.append(self._logprobs_without_grad(micro))
        if self._reference_in_loss:
            self._reference_lps.append(self.reference.logprobs(micro))

    def _join_before_update(self) -> None:
        """`_remember_before_update`'s forwards on no rows, joining the other ranks' collectives."""
        if self._algorithm.tis_cap is not None:
            self._empty_pass(grad=False)
        if self._reference_in_loss:
            self.reference.join()

    def reference_kl(self, batch: PackedBatch | None, micro_batches: int) -> tuple[list[float], int]:
        """With the KL in the reward: per row of this rank's share, its summed KL estimate against the reference,
        and the tokens counted (`ReferencePolicy.row_kl`)."""
        return self.reference.row_kl(batch, micro_batches, self._algorithm.kl_estimator)

    def _logprobs_without_grad(self, micro: PackedBatch) -> torch.Tensor:
        """The trainer's own logprobs of the micro-batch's tokens before this step's update (the proximal policy)."""
        with torch.no_grad(), self._autocast():
            logits = self.model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
            return token_logprobs(logits.float(), micro.input_ids, temperature=self._temperature)

    def _micro_loss(self, micro: PackedBatch, proximal: torch.Tensor | None, reference: torch.Tensor | None,
                    total_rows: int, total_tokens: int):
        """(loss, stats, (sum, max) of |trainer - engine| log-ratios or None): the policy loss of one micro-batch;
        with proximal logprobs the ratio is taken against them and each token is weighted by its truncated
        importance weight min(pi_proximal / pi_engine, tis_cap)."""
        with self._autocast():
            logits = self.model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
        logprobs = token_logprobs(logits.float(), micro.input_ids, temperature=self._temperature)
        entropy = token_entropy(logits, self._temperature) if self._algorithm.entropy_coef else None
        weights = token_weights(micro.loss_mask, self._algorithm, total_rows, total_tokens)
        if proximal is None:
            loss, stats = policy_loss(logprobs, micro.gen_logprobs, micro.advantages, micro.loss_mask, weights,
                                      self._algorithm, entropy, reference)
            return loss, stats, None
        keep = micro.loss_mask.to(torch.bool)
        log_ratio = torch.where(keep, proximal - micro.gen_logprobs, 0.0)
        weights = weights * log_ratio.exp().clamp(max=self._algorithm.tis_cap)
        loss, stats = policy_loss(logprobs, proximal, micro.advantages, micro.loss_mask, weights, self._algorithm,
                                  entropy, reference)
        gap = log_ratio.abs()
        return loss, stats, (float(gap.sum().item()), float(gap.max().item()) if keep.any() else 0.0)

    def _empty_pass(self, grad: bool = True) -> None:
        """A masked-out row: joins the other ranks' collectives (a forward, and with `grad` a backward of zeros)."""
        ids = torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.device)
        with torch.set_grad_enabled(grad), self._autocast():
            logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        if grad:
            (logits.float().sum() * 0.0).backward()  # joins the others' reduce-scatters with zeros

    def _autocast(self):
        if self.autocast:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def optimizer_step(self) -> tuple[float, bool]:
        """Clip and step; a non-finite gradient skips the update instead of poisoning the weights. The norm is
        the whole model's (FSDP2's sharded gradients reduce it across the ranks), so every rank decides alike."""
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self._cfg.max_grad_norm))
        stepped = math.isfinite(norm)
        if stepped:
            self.optimizer.step()
        else:
            logger.warning("non-finite gradient norm (%s): the optimizer step is skipped", norm)
        self.optimizer.zero_grad(set_to_none=True)
        return (norm if stepped else 0.0), stepped

    def full_state(self, adapters_only: bool = False) -> dict[str, torch.Tensor]:
        """The whole model's state dict on rank 0 (every other rank returns an empty one): one parameter at a time
        is gathered to rank 0's host memory, so no rank ever holds a full copy on its device. With LoRA, the base
        model's weights with the adapters merged in, or with `adapters_only` the adapters under peft's names."""
        if self.ranks == 1:
            state = self.model.state_dict()
        else:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=adapters_only)
            state = get_model_state_dict(self.model, options=options)
        if self.lora is None or not state:
            return state
        return adapter_state(state) if adapters_only else merged_state(state, scaling(self.lora))

    def save(self, directory: Path) -> None:
        """This rank's shard of the weights and AdamW state into `directory/shards` (DCP), and its RNG state."""
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=self._state_options)
        with _one_process_is_meant():
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory / SHARDS))
        (directory / RNG).mkdir(parents=True, exist_ok=True)
        torch.save(rng_state(self.device), directory / RNG / f"rank_{self.rank}.pt")

    def load(self, directory: Path) -> None:
        """Weights and AdamW state from a DCP folder written by any number of ranks; the RNG of the same rank when
        the checkpoint has one (a rank the writer did not have keeps its seeded RNG)."""
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=self._state_options)
        state = {"model": model_state, "optim": optim_state}
        with _one_process_is_meant():
            dcp.load(state, checkpoint_id=str(directory / SHARDS))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=self._load_options)
        rng_path = directory / RNG / f"rank_{self.rank}.pt"
        if rng_path.is_file():
            set_rng_state(torch.load(rng_path, weights_only=True), self.device)

    def refresh_copy(self, meta: dict) -> str | None:
        """This rank's shard as of the step `meta` names, to its keepers (`self.copies`); what went wrong, or None."""
        blob = shard_bytes(self.model, self.optimizer, self._state_options, self.device,
                           {**meta, "rank": self.rank, "ranks": self.ranks})
        return self.copies.push(int(meta["step"]), blob)

    def load_copy(self, step: int) -> dict:
        """This rank's shard as of train step `step`, from a keeper that holds it; returns the copy's meta."""
        blob = self.copies.fetch(step)
        return load_shard_bytes(self.model, self.optimizer, self._state_options, self._load_options, self.device,
                                blob)


@contextlib.contextmanager
def _one_process_is_meant():
    """DCP warns each time it saves or loads outside a process group; with one rank that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
