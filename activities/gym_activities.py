"""The Gym phase of an attempt, driven from the controller over the participant protocol.

prepare: close admission and suspend rollout deadlines (one holder, `snapshot:<id>`, in
both hold sets), flush pending ACKs, park the environment servers' agents, then fence
and drain the policy server. The order matters: an agent that is mid-turn needs its
policy call answered to reach its boundary, so the policy server closes only after
every agent is parked. Resume runs the other way round: policy first, then agents, then
admission and the deadline clocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from temporalio import activity

from activities.errors import participant_errors
from participants.client import ParticipantClient
from activities.snapshot_context import SnapshotContext
from primitives.chaos_points import reached
from schemas.participant import ParticipantStatus
from schemas.snapshot import GymCommitResult, GymInput, GymPrepareResult, GymReleaseResult

POLL_S = 0.05
HEARTBEAT_S = 1.0


@contextmanager
def heartbeating(detail: str) -> Iterator[None]:
    """Heartbeat while a slow participant call is awaited, so a cancel reaches us promptly."""

    async def beat() -> None:
        while True:
            activity.heartbeat(detail)
            await asyncio.sleep(HEARTBEAT_S)

    task = asyncio.get_running_loop().create_task(beat())
    try:
        yield
    finally:
        task.cancel()


class GymActivities:
    def __init__(self, ctx: SnapshotContext) -> None:
        self._ctx = ctx

    @activity.defn(name="gym.prepare")
    async def prepare(self, inp: GymInput) -> GymPrepareResult:
        ctx = self._ctx
        ctx.check(inp.incarnation)
        ctx.close_admission(inp.checkpoint_id, inp.lease_s)
        started = time.monotonic()
        rows_before = ctx.controller.stats.rows_sealed
        # Rows being stored hold the barrier until their ACK is sent: passing it flushes them.
        async with ctx.controller.data_plane.barrier:
            pass
        with participant_errors(), heartbeating("preparing participants"):
            parked = 0
            for env in ctx.environments:
                status = await self._until_ready(env, inp)
                parked += status.parked
            agents_parked_s = time.monotonic() - started
            await reached("gym_prepare", ctx.run_dir)
            await self._until_ready(ctx.policy, inp)
        return GymPrepareResult(
            participant_s=round(time.monotonic() - started, 3), parked_agents=parked,
            agents_parked_s=round(agents_parked_s, 4),
            waited_for_acks=ctx.controller.stats.rows_sealed - rows_before,
        )

    async def _until_ready(self, participant: ParticipantClient, inp: GymInput) -> ParticipantStatus:
        status = await participant.prepare(inp.checkpoint_id, inp.lease_s)
        last_renew = time.monotonic()
        while not status.ready:
            await asyncio.sleep(POLL_S)
            if time.monotonic() - last_renew > inp.lease_s / 3:
                await self._ctx.renew_leases(inp.checkpoint_id, inp.lease_s, participants=False)
                await participant.renew(inp.checkpoint_id, inp.lease_s)
                last_renew = time.monotonic()
            status = await participant.status(inp.checkpoint_id)
        return status

    @activity.defn(name="gym.commit")
    async def commit(self, inp: GymInput) -> GymCommitResult:
        ctx = self._ctx
        ctx.check(inp.incarnation)
        started = time.monotonic()
        artifacts, counts = [], {}
        with participant_errors(), heartbeating("committing participants"):
            await ctx.renew_leases(inp.checkpoint_id, inp.lease_s)
            for participant in ctx.participants():
                directory = Path(inp.staging_dir) / participant.name
                result = await participant.commit(inp.checkpoint_id, str(directory))
                artifacts += result.artifacts
                for key, value in result.counts.items():
                    counts[key] = counts.get(key, 0) + value
                await reached("gym_commit", ctx.run_dir)
        return GymCommitResult(participant_s=round(time.monotonic() - started, 3), artifacts=artifacts, counts=counts)

    @activity.defn(name="gym.resume")
    async def resume(self, inp: GymInput) -> GymReleaseResult:
        return await self._release(inp, abort=False)

    @activity.defn(name="gym.abort")
    async def abort(self, inp: GymInput) -> GymReleaseResult:
        return await self._release(inp, abort=True)

    async def _release(self, inp: GymInput, abort: bool) -> GymReleaseResult:
        """Policy first, then agents, then admission and deadlines; every call is idempotent."""
        ctx = self._ctx
        if ctx.is_stale(inp.incarnation):
            # The incarnation that closed those gates died with its processes: nothing to undo.
            activity.logger.info("release of %s from incarnation %d: nothing left to undo", inp.checkpoint_id,
                                 inp.incarnation)
            return GymReleaseResult(participant_s=0.0, admission_closed_s=0.0)
        ctx.check(inp.incarnation)
        if not abort:
            await reached("resume", ctx.run_dir)
        started = time.monotonic()
        with participant_errors():
            for participant in [ctx.policy, *ctx.environments]:
                if abort:
                    await participant.abort(inp.checkpoint_id)
                else:
                    await participant.resume(inp.checkpoint_id)
        participant_s = time.monotonic() - started
        closed_s = ctx.reopen_admission(inp.checkpoint_id)
        return GymReleaseResult(participant_s=round(participant_s, 3), admission_closed_s=round(closed_s, 3))
