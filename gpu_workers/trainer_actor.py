"""Ray actor that hosts the trainer in its own process, with the trainer hold set."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import ray

from turnkeep.gpu_workers.shared_weights import SharedWeights
from turnkeep.primitives.chaos_points import reached
from turnkeep.primitives.holds import HoldSet, UnknownHolder
from turnkeep.primitives.run_member import RunMember
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.rollout import RolloutRow


@ray.remote(num_cpus=0)
class TrainerActor(RunMember):
    async def setup(self, model_dir: str, cfg_json: str, rank_options: list[dict] | None = None,
                    detached: bool = False) -> int:
        """Load the model; with `train.ranks` > 1, start ranks 1..N-1 (rank r with the Ray options
        `rank_options[r - 1]`), form the group with them, and shard the model across it; with `train.rank_copies`,
        start each rank's shard keeper (`detached`: outliving the controller, as the run's processes do). Returns
        the policy version."""
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        from turnkeep.gpu_workers.trainer import Trainer  # torch loads only inside the trainer process

        cfg = TurnkeepConfig.model_validate_json(cfg_json)
        self._run_dir, self._hang_s = cfg.run.run_dir, cfg.train.hang_s
        self.hold = HoldSet("trainer")
        self._last_step: dict | None = None
        self._from_copies = False
        self._worker = None
        self._stepping = asyncio.Lock()
        followers = await self._start_ranks(model_dir, cfg, rank_options, detached) if cfg.train.ranks > 1 else []
        self._trainer = await asyncio.to_thread(
            Trainer, Path(model_dir), cfg.train, cfg.model.dtype, cfg.run.seed, cfg.rollout.temperature, self.hold,
            followers, cfg.algorithm_settings())
        if cfg.train.rank_copies:
            from turnkeep.gpu_workers.rank_copies import CopySink  # late: only with train.rank_copies

            self._trainer.local.copies = await asyncio.to_thread(CopySink, 0, cfg.train.ranks, detached)
        self.rank_pids: list[int] = []
        if followers:
            self.rank_pids = list(await self._follower_setups)
            self._rank_watch = asyncio.create_task(_exit_when_a_rank_dies(followers), name="rank-watch")
            self._trainer.ranks.on_broken = self._leave_broken_group
        self._policy_dtype = cfg.policy.dtype or cfg.model.dtype
        self._shared = SharedWeights(ray.put)
        return self._trainer.policy_version

    async def _start_ranks(self, model_dir: str, cfg: TurnkeepConfig, options: list[dict] | None,
                           detached: bool) -> list:
        """Ranks 1..N-1 as actors this process owns (they die with it); they and this process meet at a rendezvous
        on this node. This process joins the group here; the followers' setups are awaited once the local rank
        has loaded its model (FSDP2's sharding is a collective: every rank makes it at once)."""
        from turnkeep.gpu_workers.rank_actor import TrainerRankActor
        from turnkeep.gpu_workers.rank_compute import resolve_device
        from turnkeep.gpu_workers.rank_group import join_group, open_rendezvous

        own_ip = ray.util.get_node_ip_address()
        self._rendezvous, address = open_rendezvous(own_ip)
        options = options or [{"num_gpus": 0}] * (cfg.train.ranks - 1)
        followers = [TrainerRankActor.options(**options[rank - 1]).remote() for rank in range(1, cfg.train.ranks)]
        cfg_json = cfg.model_dump_json()
        self._follower_setups = asyncio.gather(
            *(f.setup.remote(model_dir, cfg_json, address, rank, detached) for rank, f in enumerate(followers, 1)))
        await asyncio.to_thread(join_group, address, 0, cfg.train.ranks, resolve_device(cfg.train.device).type,
                                own_ip, self._rendezvous, cfg.train.hang_s)
        return followers

    def _leave_broken_group(self, failure: Exception) -> None:
        """A call failed on a rank (a rank frozen past `train.hang_s` makes the others' collectives time out): the
        group cannot go on. Its ranks on this node are killed by pid (a frozen one cannot come back half-way), and
        this process exits: the controller sees the trainer die and rebuilds the group, as after a rank's death."""
        from turnkeep.primitives.process_tree import kill_local_actor_processes  # late: only a broken group

        killed = kill_local_actor_processes(self.rank_pids, "ray::TrainerRank")
        why = str(failure).splitlines()[0][:300]
        logging.getLogger("turnkeep.trainer").error(
            "%s; the trainer's process exits so the run rebuilds the group (%d rank process(es) killed by pid)",
            why, killed)
        hung = not isinstance(getattr(failure, "cause", None), ray.exceptions.RayActorError)
        if hung and self._run_dir.is_dir():  # the run directory is on this node (always on the run's own Ray)
            from turnkeep.primitives.atomic_files import append_jsonl  # late: only a broken group
            from turnkeep.schemas.choices import MetricsKind  # late: only a broken group

            append_jsonl(self._run_dir / "metrics.jsonl", {
                "kind": MetricsKind.HANG, "t": round(time.time(), 3), "target": "trainer ranks", "pid": os.getpid(),
                "probe": getattr(failure, "probe", "collective timeout"), "hang_s": self._hang_s, "why": why,
                "killed": killed})
        os._exit(1)

    async def ranks(self) -> list[int]:
        """The pids of ranks 1..N-1 (rank 0 is this process)."""
        return self.rank_pids

    async def train_step(self, rows: list[dict], step: int) -> dict:
        parsed = [RolloutRow.model_validate(row) for row in rows]
        async with self._stepping:
            await reached("train_step", self._run_dir)  # a test's slow step: it computes for TURNKEEP_CHAOS_WAIT_S
            stats = await self._trainer.train_step(parsed, step)
            self._last_step = {"step": step, "groups": list(dict.fromkeys(row.group_id for row in parsed))}
            self._from_copies = False
        if stats["policy_version"] != step:
            raise RuntimeError(f"trainer reached version {stats['policy_version']} but the controller expected {step}")
        return stats

    async def version(self) -> int:
        """The policy version once no step is running (a caller that went away may have left one)."""
        async with self._stepping:
            return self._trainer.policy_version

    async def progress(self) -> dict:
        """Once no step is running: the policy version, and the last step this process trained with its groups
        (None since a checkpoint load): what a controller that died mid-step never journaled. `from_copies`: the
        trainer was rebuilt from its ranks' copies and has not stepped since."""
        async with self._stepping:
            return {"version": self._trainer.policy_version, "last_step": self._last_step,
                    "from_copies": self._from_copies}

    async def restore_copies(self) -> dict:
        """A rebuilt trainer: every rank's shard from the newest step its keepers all hold (`train.rank_copies`),
        so the run goes on from the step the dead group reached. {"step", "groups"}, or {"why"} it could not."""
        if self._trainer.local.copies is None:
            return {"why": "train.rank_copies is off"}
        async with self._stepping:
            try:
                restored = await self._trainer.restore_copies()
            except Exception as err:  # noqa: BLE001 - a copy that cannot load leaves the restore to the checkpoint
                restored = {"why": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"}
            if "step" in restored:
                self._last_step, self._from_copies = restored, True
            return restored

    async def weights_blob(self) -> bytes:
        """The weights as the policy server loads them (its dtype), serialised on the trainer's device."""
        return await self._trainer.weights_blob(self._policy_dtype)

    async def shared_weights(self) -> list:
        """The current weights as one object in Ray's object store, in a list (so a caller gets the reference, and
        each engine reads the one object instead of the trainer serializing them for each)."""
        async with self._stepping:
            version = self._trainer.policy_version
            return [await self._shared.ref(version, lambda: self._trainer.weights_blob(self._policy_dtype))]

    async def versioned_weights(self) -> tuple[int, bytes]:
        """The policy version and its weights, taken together between steps (call with `num_returns=2`, so the
        bytes stay in Ray's object store and go to the engine that loads them, not through the caller)."""
        async with self._stepping:
            return self._trainer.policy_version, await self._trainer.weights_blob(self._policy_dtype)

    async def load_checkpoint(self, directory: str, step: int) -> int:
        """Restore the `trainer/` folder of the checkpoint of train step `step`; returns the policy version."""
        async with self._stepping:
            self._shared.forget()
            self._last_step, self._from_copies = None, False
            version = await self._trainer.load_checkpoint(Path(directory), step)
            if self._trainer.local.copies is not None:
                await self._trainer.forget_copies()  # of steps past this checkpoint, which the run trains again
            return version

    async def save_checkpoint(self, directory: str) -> None:
        await self._trainer.save_checkpoint(Path(directory))

    async def hold_add(self, holder: str, lease_s: float | None = None) -> bool:
        added = self.hold.add(holder, lease_s)
        if added:
            self._trainer.hold_wait_clock.added_at[holder] = time.monotonic()
        return added

    async def waiting_on_hold(self) -> bool:
        """A train step has computed its gradients and waits for the hold to clear before any rank steps."""
        return self._trainer.hold_wait_clock.waiting_since is not None

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
        from turnkeep.activities.trainer_activities import TrainerActivities
        from turnkeep.primitives.temporal_client import connect, start_worker, step_activities
        from turnkeep.schemas.names import trainer_queue
        from turnkeep.schemas.steps import Runs

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

    async def holds_weights_of(self, version: int) -> bool:
        """With a holder in the trainer hold: whether the weights are still policy `version`'s and stay so. Not
        under `_stepping`, so it answers while a step computes: the running step has begun no optimizer step, and
        cannot begin one while the hold is held (it sets `weights_moved` the moment the hold clears for it)."""
        held = not self.hold.is_clear()
        return held and not self._trainer.weights_moved and self._trainer.policy_version == version

    async def hold_release(self, holder: str) -> bool:
        return self.hold.release(holder)

    async def hold_release_timed(self, holder: str) -> tuple[bool, float]:
        """Release `holder`; (whether it was held, seconds the optimizer step waited on it)."""
        waited = self._trainer.hold_wait_clock.waited_on(holder)
        return self.hold.release(holder), round(waited, 3)


RANK_PROBE_S = 1.0


async def _exit_when_a_rank_dies(followers: list) -> None:
    """The group cannot go on without any of its ranks (the others' collectives would wait for it), so a rank that
    dies takes this process with it: the controller sees the trainer die, and replaces the whole group."""
    while True:
        for rank, follower in enumerate(followers, 1):
            try:
                await follower.__ray_ready__.remote()
            except ray.exceptions.RayActorError as err:
                first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
                logging.getLogger("turnkeep.trainer").error(
                    "trainer rank %d of %d died (%s): the trainer's process exits so the run rebuilds the group",
                    rank, len(followers) + 1, first)
                os._exit(1)
        await asyncio.sleep(RANK_PROBE_S)
