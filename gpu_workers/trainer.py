"""The trainer: GRPO steps on a Hugging Face causal LM over its ranks, the hold before each optimizer step, the
policy version, and checkpoints.

The optimizer step is the only moment that changes what a checkpoint or snapshot would
record, so `train_step` awaits the trainer hold right before every optimizer step; the
forward/backward work before it runs in threads (and on the other ranks) so the hold can be
taken and released while it computes. The hold is one decision for the whole group: this
process waits for it, then has every rank step at once, so every rank steps or none does and a
snapshot sees the same step on all of them.

Each rank (`gpu_workers.rank_compute`) holds its shard of the model on `train.device` (auto =
CUDA when its process sees a GPU); on CUDA with float32 weights the forward and backward run
under bfloat16 autocast (`train.autocast_bf16`). A step's rows are split between the ranks by
group; each rank's share is split into micro-batches of `train.micro_batch_rows` rows whose
gradients accumulate, the loss normalised by the whole step's token count so the step is the
same as in one piece on one rank.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import torch

from turnkeep.gpu_workers.grpo import build_batch
from turnkeep.gpu_workers.rank_compute import DTYPES, RankCompute, resolve_device
from turnkeep.gpu_workers.rank_group import RankGroup, micro_batch_count, split_by_group
from turnkeep.gpu_workers.weights_blob import pack_state_dict
from turnkeep.primitives.atomic_files import atomic_write_json, fsync_tree
from turnkeep.primitives.hold_wait_clock import HoldWaitClock
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.config import TrainConfig
from turnkeep.schemas.config_algorithm import AlgorithmConfig
from turnkeep.schemas.rollout import RolloutRow

__all__ = ["Trainer", "resolve_device"]
TRAINER_STATE = "trainer_state.json"


class Trainer:
    def __init__(
        self, model_dir: Path, cfg: TrainConfig, dtype: str, seed: int, temperature: float, hold: HoldSet,
        followers=(), algorithm: AlgorithmConfig | None = None,
    ) -> None:
        """`followers`: the `TrainerRankActor`s of ranks 1..N-1, already in this process's group (none: one rank);
        `algorithm`: the resolved `[algorithm]` (`TurnkeepConfig.algorithm_settings`; None: the defaults)."""
        self._cfg = cfg
        self._algorithm = algorithm or AlgorithmConfig().resolved(cfg.clip_eps, 1)
        self.local = RankCompute(model_dir, cfg, dtype, seed, temperature, self._algorithm)
        self.ranks = RankGroup(self.local, followers, hang_s=cfg.hang_s)
        self.hold = hold
        self.hold_wait_clock = HoldWaitClock()
        self.policy_version = 0
        self.step = 0
        """The last train step committed here (the controller numbers steps; the policy version counts updates)."""
        self.weights_moved = False
        """The running step has begun an optimizer step: the weights are no longer those of `policy_version`."""

    @property
    def model(self) -> torch.nn.Module:
        """Rank 0's model (with several ranks, its parameters are shards)."""
        return self.local.model

    @property
    def device(self) -> torch.device:
        return self.local.device

    @property
    def autocast(self) -> bool:
        return self.local.autocast

    async def train_step(self, rows: list[RolloutRow], step: int) -> dict:
        # A group's rows together, so a share of the batch holds whole groups.
        order = {group: i for i, group in enumerate(dict.fromkeys(row.group_id for row in rows))}
        rows = sorted(rows, key=lambda row: order[row.group_id])
        batch = build_batch(rows, self.local.pad_id, algorithm=self._algorithm)
        shares = split_by_group(batch, self.ranks.size)
        passes = micro_batch_count(shares, self._cfg.micro_batch_rows)
        totals = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "grad_norm": 0.0, "hold_wait_s": 0.0}
        if self._algorithm.kl_coef and self._algorithm.kl_in == "reward":
            batch, totals["kl_reference"] = await self._with_kl_in_rewards(rows, shares, passes)
            shares = split_by_group(batch, self.ranks.size)
        backward_args = [(share, batch.num_loss_tokens, passes, len(batch.group_ids)) for share in shares]
        skipped = 0
        compute_s = 0.0
        for index in range(self._cfg.passes_per_batch):
            started = time.monotonic()
            per_rank = await self.ranks.all("backward", [(*args, index == 0) for args in backward_args])
            compute_s += time.monotonic() - started
            if index == 0 and "engine_mismatch_mean" in per_rank[0]:
                # Each rank's share of the mean is over the whole step's tokens: the shares add up.
                totals["engine_mismatch_mean"] = sum(stats["engine_mismatch_mean"] for stats in per_rank)
                totals["engine_mismatch_max"] = max(stats["engine_mismatch_max"] for stats in per_rank)
            waited = time.monotonic()
            if not self.hold.is_clear():
                self.hold_wait_clock.waiting_since = waited
            await self.hold.wait_clear()
            self.weights_moved = True  # before the optimizer step's first await: see `TrainerActor.holds_weights_of`
            self.hold_wait_clock.waiting_since = None
            totals["hold_wait_s"] += time.monotonic() - waited
            norm, stepped = (await self.ranks.all("optimizer_step"))[0]
            skipped += not stepped
            totals["grad_norm"] += norm / self._cfg.passes_per_batch
            for key in ("loss", "clip_frac", "approx_kl", "kl_reference"):
                # Each rank's share is already normalised by the whole step's token count: the shares add up.
                if key in per_rank[0]:
                    totals[key] = totals.get(key, 0.0) + sum(s[key] for s in per_rank) / self._cfg.passes_per_batch
        self.policy_version += 1
        self.step, self.weights_moved = step, False
        if self.local.copies is not None:
            totals["copy_s"] = await self._refresh_copies(step, list(order))
        return {**{k: round(v, 5) for k, v in totals.items()}, "compute_s": round(compute_s, 3),
                "nonfinite_steps_skipped": skipped, "ranks": self.ranks.size,
                "policy_version": self.policy_version, "tokens": batch.num_loss_tokens,
                "truncated_rows": sum(row.truncated for row in rows)}

    async def _refresh_copies(self, step: int, groups: list[str]) -> float:
        """Every rank's shard as of this step to its keepers (`gpu_workers.rank_copies`); once all have theirs, the
        older copies go. Seconds it took. A keeper that is gone costs that copy, not the step."""
        started = time.monotonic()
        meta = {"step": step, "policy_version": self.policy_version, "groups": groups}
        problems = await self.ranks.all("refresh_copy", [(meta,)] * self.ranks.size)
        if not any(problems):
            await asyncio.to_thread(self.local.copies.commit, step)
        return time.monotonic() - started

    async def restore_copies(self) -> dict:
        """Every rank's shard from the newest step all of them have a copy of: {"step", "groups"} of that step, or
        {"why"} none could be loaded (the rank keeps what it has)."""
        from turnkeep.gpu_workers.rank_copies import newest_complete_step  # late: Ray, only with copies

        step, why = await asyncio.to_thread(newest_complete_step, self.ranks.size)
        if step is None:
            return {"why": why}
        metas = await self.ranks.all("load_copy", [(step,)] * self.ranks.size)
        self.policy_version, self.step = int(metas[0]["policy_version"]), int(metas[0]["step"])
        return {"step": self.step, "groups": metas[0]["groups"]}

    async def forget_copies(self) -> None:
        from turnkeep.gpu_workers.rank_copies import forget_copies  # late: Ray, only with copies

        await asyncio.to_thread(forget_copies, self.ranks.size)

    async def _with_kl_in_rewards(self, rows: list[RolloutRow], shares, passes: int) -> tuple:
        """(the batch again, each row's reward less kl_coef x its summed KL estimate against the reference; the
        mean estimate per token): the ranks compute the rows' KL on their shares first, as the advantages need it."""
        per_rank = await self.ranks.all("reference_kl", [(share, passes) for share in shares])
        sums = [value for rank_sums, _ in per_rank for value in rank_sums]
        tokens = sum(count for _, count in per_rank)
        penalties = [-self._algorithm.kl_coef * value for value in sums]
        batch = build_batch(rows, self.local.pad_id, algorithm=self._algorithm, reward_shaping=penalties)
        return batch, sum(sums) / max(tokens, 1)

    def _lora_identity(self) -> dict | None:
        """What a checkpoint records of `[train.lora]`: what its adapters are (None: full weights). An export
        merges them with its alpha / rank."""
        lora = self.local.lora
        return None if lora is None else {"rank": lora.rank, "alpha": lora.alpha,
                                          "target_modules": list(lora.target_modules)}

    async def weights_blob(self, dtype: str | None = None) -> bytes:
        """The state dict as safetensors bytes, under the names the model directory uses (with LoRA, the adapters
        merged in; or, with `train.lora.refit = "adapters"`, the adapters alone), cast to `dtype` (the policy
        server's). With one rank it is cast on the device before it is copied to host memory; with
        several, rank 0 gathers it one parameter at a time into host memory."""
        adapters_only = self._cfg.lora.rank is not None and self._cfg.lora.refit == "adapters"
        state = (await self.ranks.all("full_state", [(adapters_only,)] * self.ranks.size))[0]
        return await asyncio.to_thread(pack_state_dict, state, DTYPES[dtype] if dtype else None)

    async def load_checkpoint(self, directory: Path, step: int) -> int:
        """Continue at train step `step` from `save_checkpoint`'s output, written by any number of ranks: weights,
        optimizer moments, RNG and version; returns the version."""
        state = orjson.loads((directory / TRAINER_STATE).read_bytes())
        written, ours = state.get("lora"), self._lora_identity()
        if written != ours:
            raise ValueError(f"the trainer checkpoint {directory} was written with {_lora_words(written)} and this "
                             f"run has {_lora_words(ours)}; a checkpoint loads only into the same [train.lora]: set "
                             "it as the run that wrote it did")
        await self.ranks.all("load", [(directory,)] * self.ranks.size)
        self.policy_version = int(state["policy_version"])
        self.step = step
        return self.policy_version

    async def save_checkpoint(self, directory: Path) -> None:
        """Every rank writes its shard and RNG state into `directory`; then the version, and everything fsynced."""
        directory.mkdir(parents=True, exist_ok=True)
        await self.ranks.all("save", [(directory,)] * self.ranks.size)
        atomic_write_json(directory / TRAINER_STATE, {"policy_version": self.policy_version,
                                                      "ranks": self.ranks.size, "lora": self._lora_identity()})
        await asyncio.to_thread(fsync_tree, directory)


def _lora_words(lora: dict | None) -> str:
    if lora is None:
        return "full weights (no train.lora.rank)"
    return (f"LoRA adapters (train.lora rank {lora['rank']}, alpha {lora['alpha']}, target_modules "
            f"{lora['target_modules']})")
