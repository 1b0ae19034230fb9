"""`gym.*`: an attempt's phase over the environment servers, from the controller's Temporal worker (the activity
names keep the word "gym", which recorded histories hold; see the glossary in docs/layout.md).

A journal snapshot (`snapshot.agents = "journal"`) only marks: every server's turn journal
is made durable and its position recorded; nothing closes, parks or is written.

prepare closes admission and suspends the rollout deadlines (one holder, in both hold
sets), flushes pending ACKs (sent outside the data-plane barrier; see `pending_acks`), then parks every environment server's agents
(`controller.snapshot.env_server_phase`); resume and abort release them and reopen admission.
The policy server is fenced after this and resumed before it, by its own activities
(`policy.*`, in its process).
"""

from __future__ import annotations

from pathlib import Path

from temporalio import activity

from turnkeep.activities.budget import remaining_budget_s
from turnkeep.activities.errors import check_incarnation, expected_failure, translated_errors
from turnkeep.activities.heartbeat import heartbeating
from turnkeep.activities.input_checks import check_lease, check_staging_dir, parse_attempt_id
from turnkeep.controller.snapshot.coordinator import SnapshotCoordinator
from turnkeep.controller.snapshot.env_server_phase import (
    commit_participants,
    mark_participants,
    prepare_participants,
    release_participants,
)
from turnkeep.primitives.chaos_points import reached
from turnkeep.schemas.attempt_steps import (
    GYM_ABORT,
    GYM_COMMIT,
    GYM_MARK,
    GYM_PREPARE,
    GYM_RESUME,
    GymCommitResult,
    GymInput,
    GymMarkResult,
    GymPrepareResult,
    GymReleaseResult,
)
from turnkeep.schemas.names import ErrorType

ACK_FLUSH_S = 15.0
"""How long prepare waits for ACKs in flight; one still unanswered then is named by the server's readiness."""


async def flush_acks(data_plane) -> None:
    """Rows being stored hold the barrier and add their receipt: passing it, then waiting for the
    receipts, sends every pending ACK before the participants are asked to prepare."""
    async with data_plane.barrier:
        pass
    budget_s = remaining_budget_s()
    if late := await data_plane.pending_acks.drained(ACK_FLUSH_S if budget_s is None else min(ACK_FLUSH_S, budget_s)):
        activity.logger.warning("%d ACKs still in flight after %.0f s (%s); the environment server's readiness "
                                "names what it waits on", len(late), ACK_FLUSH_S, ", ".join(late[:3]))


def _refuse_if_a_server_is_away(snapshots: SnapshotCoordinator) -> None:
    """An environment server that is away can neither save nor mark its agents, and waiting for it would hold
    admission (a parked attempt) for nothing: the attempt fails at once, naming it."""
    if away := snapshots.controller.env_client.away():
        raise expected_failure("; ".join(away) + "; this attempt fails, the previous snapshot stays the restore "
                               "point", ErrorType.PARTICIPANT_REFUSED)


class EnvServerActivities:
    def __init__(self, snapshots: SnapshotCoordinator) -> None:
        self._snapshots = snapshots

    @activity.defn(name=GYM_MARK)
    async def mark(self, inp: GymInput) -> GymMarkResult:
        """A journal snapshot's phase over the environment servers: nothing closes or parks; each environment server makes its turn
        journal durable and says where it stands."""
        snapshots = self._snapshots
        check_incarnation(inp.incarnation, snapshots.incarnation)
        parse_attempt_id("checkpoint_id", inp.checkpoint_id, snapshots.run_id)
        _refuse_if_a_server_is_away(snapshots)
        with translated_errors():
            marks, participant_s = await mark_participants(snapshots.environments, inp.checkpoint_id)
        await reached("gym_prepare", snapshots.run_dir)  # the chaos point of this phase, whichever kind
        return GymMarkResult(participant_s=participant_s, marks=marks)

    @activity.defn(name=GYM_PREPARE)
    async def prepare(self, inp: GymInput) -> GymPrepareResult:
        snapshots = self._snapshots
        check_incarnation(inp.incarnation, snapshots.incarnation)
        check_lease("lease_s", inp.lease_s)
        parse_attempt_id("checkpoint_id", inp.checkpoint_id, snapshots.run_id)
        _refuse_if_a_server_is_away(snapshots)
        snapshots.close_admission(inp.checkpoint_id, inp.lease_s)
        await flush_acks(snapshots.controller.data_plane)
        with translated_errors(), heartbeating("preparing participants"):
            prepared = await prepare_participants(
                snapshots.environments, inp.checkpoint_id, inp.lease_s,
                renew_others=lambda: snapshots.renew_leases(inp.checkpoint_id, inp.lease_s, participants=False),
                agents_parked=lambda: reached("gym_prepare", snapshots.run_dir), budget_s=remaining_budget_s(),
            )
        return GymPrepareResult(participant_s=prepared.participant_s, agents_parked_s=prepared.agents_parked_s)

    @activity.defn(name=GYM_COMMIT)
    async def commit(self, inp: GymInput) -> GymCommitResult:
        snapshots = self._snapshots
        check_incarnation(inp.incarnation, snapshots.incarnation)
        check_lease("lease_s", inp.lease_s)
        step, number = parse_attempt_id("checkpoint_id", inp.checkpoint_id, snapshots.run_id)
        # The participants write where they are told: only into this attempt's own staging directory.
        check_staging_dir("staging_dir", inp.staging_dir, snapshots.run_dir, step, number)
        with translated_errors(), heartbeating("committing participants"):
            await snapshots.renew_leases(inp.checkpoint_id, inp.lease_s)
            committed = await commit_participants(
                snapshots.environments, inp.checkpoint_id, Path(inp.staging_dir),
                after_each=lambda: reached("gym_commit", snapshots.run_dir),
            )
        return GymCommitResult(participant_s=committed.participant_s, artifacts=committed.artifacts,
                               counts=committed.counts)

    @activity.defn(name=GYM_RESUME)
    async def resume(self, inp: GymInput) -> GymReleaseResult:
        return await self._release(inp, abort=False)

    @activity.defn(name=GYM_ABORT)
    async def abort(self, inp: GymInput) -> GymReleaseResult:
        return await self._release(inp, abort=True)

    async def _release(self, inp: GymInput, abort: bool) -> GymReleaseResult:
        snapshots = self._snapshots
        if snapshots.is_stale(inp.incarnation):
            # The incarnation that closed those gates died with its processes: nothing to undo.
            activity.logger.info("release of %s from incarnation %d: nothing left to undo", inp.checkpoint_id,
                                 inp.incarnation)
            return GymReleaseResult(participant_s=0.0, admission_closed_s=0.0)
        check_incarnation(inp.incarnation, snapshots.incarnation)
        if not abort:
            await reached("resume", snapshots.run_dir)
        with translated_errors():
            participant_s = await release_participants(snapshots.environments, inp.checkpoint_id, abort)
        closed_s = snapshots.reopen_admission(inp.checkpoint_id)
        return GymReleaseResult(participant_s=participant_s, admission_closed_s=round(closed_s, 3))
