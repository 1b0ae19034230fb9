"""Ray actor that hosts the trainer in its own process, with the trainer hold set."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import ray

from gpu_workers.shared_weights import SharedWeights
from primitives.holds import HoldSet, UnknownHolder
from primitives.run_member import RunMember
from schemas.config import TurnkeepConfig
from schemas.rollout import RolloutRow


@ray.remote(num_cpus=0)
class TrainerActor(RunMember):
    async def setup(self, model_dir: str, cfg_json: str) -> int:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        from gpu_workers.trainer import Trainer  # torch loads only inside the trainer process

        cfg = TurnkeepConfig.model_validate_json(cfg_json)
        self.hold = HoldSet("trainer")
        self._worker = None
        self._stepping = asyncio.Lock()
        self._trainer = Trainer(
            Path(model_dir), cfg.train, cfg.model.dtype, cfg.run.seed, cfg.rollout.temperature, self.hold
        )
        self._policy_dtype = cfg.policy.dtype or cfg.model.dtype
        self._shared = SharedWeights(ray.put)
        return self._trainer.policy_version

    async def train_step(self, rows: list[dict], step: int) -> dict:
        parsed = [RolloutRow.model_validate(row) for row in rows]
        async with self._stepping:
            stats = await self._trainer.train_step(parsed, step)
        if stats["policy_version"] != step:
            raise RuntimeError(f"trainer reached version {stats['policy_version']} but the controller expected {step}")
        return stats

    async def version(self) -> int:
        """The policy version once no step is running (a caller that went away may have left one)."""
        async with self._stepping:
            return self._trainer.policy_version

    async def weights_blob(self) -> bytes:
        """The weights as the policy server loads them (its dtype), serialised on the trainer's device."""
        return self._trainer.weights_blob(self._policy_dtype)

    async def shared_weights(self) -> list:
        """The current weights as one object in Ray's object store, in a list (so a caller gets the reference, and
        each engine reads the one object instead of the trainer serializing them for each)."""
        async with self._stepping:
            version = self._trainer.policy_version
            return [self._shared.ref(version, lambda: self._trainer.weights_blob(self._policy_dtype))]

    async def versioned_weights(self) -> tuple[int, bytes]:
        """The policy version and its weights, taken together between steps (call with `num_returns=2`, so the
        bytes stay in Ray's object store and go to the engine that loads them, not through the caller)."""
        async with self._stepping:
            return self._trainer.policy_version, self._trainer.weights_blob(self._policy_dtype)

    async def load_checkpoint(self, directory: str, step: int) -> int:
        """Restore the `trainer/` folder of the checkpoint of train step `step`; returns the policy version."""
        async with self._stepping:
            self._shared.forget()
            return await asyncio.to_thread(self._trainer.load_checkpoint, Path(directory), step)

    async def save_checkpoint(self, directory: str) -> None:
        self._trainer.save_checkpoint(Path(directory))

    async def hold_add(self, holder: str, lease_s: float | None = None) -> bool:
        added = self.hold.add(holder, lease_s)
        if added:
            self._trainer.hold_wait_clock.added_at[holder] = time.monotonic()
        return added

    async def hold_holders(self) -> list[str]:
        return sorted(self.hold.holders())

    async def hold_leases(self) -> list[tuple[str, float | None]]:
        """Every holder with its remaining lease (for the controller's audit log, `controller.remote_holds`)."""
        return [(h.name, h.lease_remaining_s) for h in self.hold.snapshot()]

    async def hold_renew(self, holder: str, lease_s: float) -> bool:
        """Extend a lease the holder still has; False when it is gone (never re-adds it)."""
        try:
            self.hold.renew(holder, lease_s)
            return True
        except UnknownHolder:
            return False

    async def start_temporal_worker(
        self, address: str, namespace: str, run_id: str, incarnation: int = 1, security=None
    ) -> None:
        from activities.trainer_activities import TrainerActivities
        from primitives.temporal_client import connect, start_worker, step_activities
        from schemas.names import trainer_queue
        from schemas.steps import Runs

        client = await connect(address, namespace, security)
        acts = TrainerActivities(self.hold, self._trainer, self._trainer.hold_wait_clock, incarnation)
        self._worker, self._worker_task = start_worker(
            client, trainer_queue(run_id), activities=step_activities(acts, runs=[Runs.TRAINER])
        )

    async def stop_temporal_worker(self) -> None:
        if self._worker is not None:
            await self._worker.shutdown()
            self._worker = None

    async def fence(self) -> int:
        """A new controller took over: the dead one's Temporal worker and holds go, and a step it left running is
        waited out; returns the policy version (the restore then loads the checkpoint it chose)."""
        await self.stop_temporal_worker()
        for holder in sorted(self.hold.holders()):
            self.hold.release(holder)
        async with self._stepping:
            return self._trainer.policy_version

    async def hold_release(self, holder: str) -> bool:
        return self.hold.release(holder)

    async def hold_release_timed(self, holder: str) -> tuple[bool, float]:
        """Release `holder`; (whether it was held, seconds the optimizer step waited on it)."""
        waited = self._trainer.hold_wait_clock.waited_on(holder)
        return self.hold.release(holder), round(waited, 3)
