"""The Ray side of a trainer rank: the actor that hosts one rank other than rank 0 (which lives in the trainer's
own process) and runs its `RankCompute` (`gpu_workers.rank_compute`, the torch side) on the group's calls.

Ray titles its process `ray::TrainerRankActor` (`primitives.process_roles` and `bench.restart_phases` match it by
its `ray::TrainerRank` prefix). The trainer's process creates these actors, so Ray ties their lives to it: a
trainer that dies takes its ranks with it, and a re-attached trainer keeps them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import ray

from turnkeep.schemas.config import TurnkeepConfig


@ray.remote(num_cpus=0)
class TrainerRankActor:
    async def setup(self, model_dir: str, cfg_json: str, address: str, rank: int, detached: bool = False) -> int:
        """Join the group at `address` as `rank` and load this rank's shard of the model; with `train.rank_copies`,
        start its shard keeper (`detached`: outliving the controller). Returns the pid."""
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        from turnkeep.gpu_workers.rank_compute import RankCompute, resolve_device
        from turnkeep.gpu_workers.rank_group import join_group

        cfg = TurnkeepConfig.model_validate_json(cfg_json)
        device = resolve_device(cfg.train.device)
        await asyncio.to_thread(join_group, address, rank, cfg.train.ranks, device.type,
                                ray.util.get_node_ip_address(), None, cfg.train.hang_s)
        self._trainer = await asyncio.to_thread(
            RankCompute, Path(model_dir), cfg.train, cfg.model.dtype, cfg.run.seed, cfg.rollout.temperature,
            cfg.algorithm_settings())
        if cfg.train.rank_copies:
            from turnkeep.gpu_workers.rank_copies import CopySink  # late: only with train.rank_copies

            self._trainer.copies = await asyncio.to_thread(CopySink, rank, cfg.train.ranks, detached)
        return os.getpid()

    async def call(self, method: str, *args):
        """One of `RankCompute`'s collective methods, made on every rank at once by the group's rank 0."""
        return await asyncio.to_thread(getattr(self._trainer, method), *args)
