"""One rollout snapshot attempt, top to bottom.

preflight -> trainer.hold -> gym.prepare -> policy.prepare -> gym.commit + policy.commit
-> data_plane.cut -> (release the hold) -> publish -> policy.resume + gym.resume. A journal
snapshot (`agents = "journal"`) stops nothing: preflight -> trainer.hold -> gym.mark ->
data_plane.cut -> (release the hold) -> publish. At a trainer checkpoint it takes no hold of
its own: the train pump's checkpoint hold keeps the step still until the cut, and the
cut releases it once taken (through Ray, as the pump took it), so the whole attempt runs as
local activities in one workflow task. The
trainer's and each policy engine's activities run on their own task queues, in their own
processes; a policy step runs on every engine at once. Any failure or cancellation before publish runs the
compensations in one place (`_compensate`): abort the participants, release the hold,
delete the staging directory; the previous snapshot stays authoritative. A resume that
keeps failing after publish ends as `published_release_pending`: the snapshot is valid,
admission stays closed and the run workflow retries the release until it succeeds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

from turnkeep.workflows import engine_fanout
from turnkeep.workflows.attempt_endings import cause, classify, hand_to_parent, uncancellable
from turnkeep.workflows.timed_activity import timed_activity

with workflow.unsafe.imports_passed_through():
    from turnkeep.schemas import search_attributes as sa
    from turnkeep.schemas.attempt_steps import (
        CUT,
        DISCARD_STAGING,
        GYM_ABORT,
        GYM_COMMIT,
        GYM_MARK,
        GYM_PREPARE,
        GYM_RESUME,
        OPEN_STAGING,
        POLICY_ABORT,
        POLICY_COMMIT,
        POLICY_PREPARE,
        POLICY_RESUME,
        PREFLIGHT,
        PUBLISH,
        TRAINER_HOLD,
        TRAINER_RELEASE,
        CutInput,
        CutResult,
        DiscardStagingInput,
        GymCommitResult,
        GymInput,
        PreflightInput,
        PublishInput,
        PublishResult,
        StagingInput,
        TrainerHoldInput,
        TrainerHoldResult,
        TrainerReleaseInput,
    )
    from turnkeep.schemas.choices import AgentsMode, Outcome
    from turnkeep.schemas.names import (
        WorkflowType,
        snapshot_holder,
    )
    from turnkeep.schemas.snapshot import SnapshotAttemptInput, SnapshotAttemptResult
    from turnkeep.schemas.steps import Runs, Step

from turnkeep.workflows.retry_policies import ATTEMPT_FEW_TRIES, ATTEMPT_PERSISTENT, ATTEMPT_TRANSIENT

CANCEL_ENDS_CANCELED = "cancelled-attempt-ends-canceled"
"""Patch id: a cancelled attempt compensates, then ends as Canceled (histories from before it completed)."""
COMPENSATION_OUTLASTS_CANCEL = "compensation-outlasts-cancel"
"""Patch id: a cancel that arrives while an attempt compensates a failure waits for the compensation, then the attempt
ends Canceled with that failure's reason (histories from before it stopped compensating at the cancel: the
participants' holds and staging were left to expire and the run workflow waited 10 s for a result never sent)."""
LOCAL_CONTROLLER_PHASES = "controller-phases-local"
"""Patch id: the controller's short phases (the steps that run `Runs.LOCAL`) run as local activities (histories from
before it schedule them on the controller's task queue)."""
JOURNAL_KEEPS_CHECKPOINT_HOLD = "journal-attempt-keeps-checkpoint-hold"
"""Patch id: a journal attempt at a trainer checkpoint keeps the train pump's hold instead of taking its own on the
trainer's queue (histories from before it run `trainer.hold` and `trainer.release` there)."""
MIN_PREPARE_LEFT_S = 2.0
"""The policy server's fence gets at least this long, even when parking the agents used up the budget."""


@dataclass
class AttemptProgress:
    """What the compensation needs to know about how far the attempt got."""

    run_id: str
    holder: str
    trainer_held: bool = False
    checkpoint_hold_kept: bool = False
    """A journal attempt holds the trainer by the train pump's checkpoint hold, released after the cut."""
    checkpoint_hold_released: bool = False
    participants_started: bool = False
    staging_dir: str | None = None
    phase_s: dict[str, float] = field(default_factory=dict)
    participant_s: float = 0.0
    admission_closed_s: float = 0.0
    trainer_wait_s: float = 0.0
    agents_parked_s: float = 0.0


@workflow.defn(name=WorkflowType.SNAPSHOT_ATTEMPT)
class SnapshotAttemptWorkflow:
    def __init__(self) -> None:
        self._phase = "starting"
        self._journal = False

    @workflow.query
    def phase(self) -> str:
        return self._phase

    @workflow.run
    async def run(self, inp: SnapshotAttemptInput) -> SnapshotAttemptResult:
        started = workflow.time()
        self._journal = inp.agents == AgentsMode.JOURNAL
        progress = AttemptProgress(run_id=inp.run_id, holder=snapshot_holder(inp.checkpoint_id))
        try:
            result = await self._attempt(inp, progress)
        except (ActivityError, ApplicationError, asyncio.CancelledError) as err:
            outcome, reason, invariant = classify(err)
            cancelled = is_cancelled_exception(err)
            if workflow.patched(COMPENSATION_OUTLASTS_CANCEL):
                cancelled = await uncancellable(self._compensate(inp, progress)) or cancelled
            else:
                await self._compensate(inp, progress)
            result = self._result(inp, progress, outcome, reason)
            result.invariant_broken = invariant
            if cancelled and workflow.patched(CANCEL_ENDS_CANCELED):
                self._close(result, started)
                await uncancellable(hand_to_parent(result))
                # Compensated: the UI shows Canceled, as for any cancelled workflow; the details keep the reason.
                raise asyncio.CancelledError(reason) from None
        self._close(result, started)
        return result

    def _close(self, result: SnapshotAttemptResult, started: float) -> None:
        """The outcome where the UI's list shows it: search attributes and the details line."""
        result.wall_s = round(workflow.time() - started, 3)
        workflow.upsert_search_attributes([
            sa.OUTCOME.value_set(str(result.outcome)), sa.PARKED_AGENTS.value_set(result.parked_agents),
            sa.CLOSED_S.value_set(result.admission_closed_s),
        ])
        agents = (f"{result.journaled_agents} running agents kept in the turn journals" if self._journal else
                  f"{result.parked_agents} agents parked")
        workflow.set_current_details(
            f"{result.outcome}: {result.reason} (step {result.anchor_step}, {result.trigger}; {agents}; "
            f"admission closed {result.admission_closed_s:.2f} s)"
        )

    async def _attempt(self, inp: SnapshotAttemptInput, progress: AttemptProgress) -> SnapshotAttemptResult:
        pre = await self._call(progress, "preflight", PREFLIGHT, PreflightInput(
            run_id=inp.run_id, checkpoint_id=inp.checkpoint_id, incarnation=inp.incarnation,
            anchor_step=inp.anchor_step), inp.timeouts.phase_s, ATTEMPT_FEW_TRIES)
        if pre.skip_reason:
            await self._compensate(inp, progress)
            return self._result(inp, progress, Outcome.SKIPPED, pre.skip_reason)
        hold = await self._hold_trainer(inp, progress)
        if hold is not None and hold.step != inp.anchor_step:
            await self._compensate(inp, progress)
            return self._result(inp, progress, Outcome.SKIPPED,
                                f"trainer reached step {hold.step} before the hold; anchor is {inp.anchor_step}")
        participant_input = await self._open_staging(inp, progress)
        if inp.agents == AgentsMode.JOURNAL:
            return await self._journal_attempt(inp, progress, participant_input, hold)
        return await self._parked_attempt(inp, progress, participant_input, hold)

    async def _hold_trainer(self, inp: SnapshotAttemptInput, progress: AttemptProgress) -> TrainerHoldResult | None:
        """`trainer.hold` on the trainer's queue; None when the attempt takes no hold of its own."""
        if self._keeps_checkpoint_hold(inp):
            # Preflight saw the trainer at the anchor, held since the checkpoint; the cut checks the step again.
            progress.checkpoint_hold_kept = True
            return None
        if not inp.trainer_hold:
            return None
        progress.trainer_held = True
        return await self._call(progress, "trainer_hold", TRAINER_HOLD, TrainerHoldInput(
            holder=progress.holder, lease_s=inp.timeouts.lease_s, incarnation=inp.incarnation,
            release_also=[inp.checkpoint_hold] if inp.checkpoint_hold else []), inp.timeouts.phase_s,
            ATTEMPT_TRANSIENT)

    async def _open_staging(self, inp: SnapshotAttemptInput, progress: AttemptProgress) -> GymInput:
        """The attempt's staging directory; returns what every participant step (`gym.*`, `policy.*`) takes."""
        staging = await self._call(progress, "preflight", OPEN_STAGING, StagingInput(
            run_id=inp.run_id, checkpoint_id=inp.checkpoint_id, incarnation=inp.incarnation,
            anchor_step=inp.anchor_step, number=inp.number), inp.timeouts.phase_s, ATTEMPT_FEW_TRIES)
        progress.staging_dir = staging.staging_dir
        return GymInput(run_id=inp.run_id, checkpoint_id=inp.checkpoint_id, incarnation=inp.incarnation,
                        lease_s=inp.timeouts.lease_s, staging_dir=staging.staging_dir)

    async def _parked_attempt(self, inp: SnapshotAttemptInput, progress: AttemptProgress, participant_input: GymInput,
                              hold: TrainerHoldResult | None) -> SnapshotAttemptResult:
        """Admission closes and every agent parks, the participants write their artifacts, the cut and publish, and
        the participants resume."""
        progress.participants_started = True
        await self._prepare_participants(inp, progress, participant_input)
        committed, policy_committed = await self._commit_participants(inp, progress, participant_input)
        cut, published = await self._cut_and_publish(
            inp, progress, participant_input, hold, committed.artifacts + policy_committed.artifacts,
            {**committed.counts, **policy_committed.counts})

        outcome, reason = Outcome.PUBLISHED, f"published {published.snapshot_dir}"
        try:
            await self._release(inp, progress, participant_input, inp.timeouts.phase_s, ATTEMPT_FEW_TRIES,
                                abort=False)
        except ActivityError as err:
            outcome = Outcome.PUBLISHED_RELEASE_PENDING
            reason = f"published {published.snapshot_dir}; release failed and is retried: {cause(err)}"
        result = self._published(inp, progress, outcome, reason, cut, published)
        result.parked_agents = committed.counts.get("parked_agents", 0)
        return result

    async def _prepare_participants(self, inp: SnapshotAttemptInput, progress: AttemptProgress,
                                    participant_input: GymInput) -> None:
        """`gym.prepare` parks the environment servers' agents; only then `policy.prepare` fences every engine."""
        budget = inp.timeouts
        # snapshot.prepare_timeout_s bounds the whole prepare (both activities, every retry), not each try.
        prepare_ends = workflow.time() + budget.prepare_s
        prepared = await self._call(progress, "gym_prepare", GYM_PREPARE, participant_input, budget.prepare_s,
                                    ATTEMPT_FEW_TRIES, heartbeat_s=10, total_s=budget.prepare_s)
        progress.participant_s += prepared.participant_s
        progress.agents_parked_s = prepared.agents_parked_s
        # Only now: a mid-turn agent needs its policy call answered to reach its boundary.
        left_s = max(MIN_PREPARE_LEFT_S, prepare_ends - workflow.time())
        fenced = engine_fanout.prepared(await self._on_engines(
            inp, progress, "gym_prepare", POLICY_PREPARE, participant_input, left_s, ATTEMPT_FEW_TRIES, heartbeat_s=10,
            total_s=left_s))
        progress.participant_s += fenced.participant_s

    async def _commit_participants(self, inp: SnapshotAttemptInput, progress: AttemptProgress,
                                   participant_input: GymInput) -> tuple[GymCommitResult, GymCommitResult]:
        """`gym.commit`, then `policy.commit` on every engine: (the environment servers', the engines') results."""
        committed = await self._call(progress, "gym_commit", GYM_COMMIT, participant_input, inp.timeouts.phase_s,
                                     ATTEMPT_TRANSIENT, heartbeat_s=10)
        policy_committed = engine_fanout.committed(await self._on_engines(
            inp, progress, "gym_commit", POLICY_COMMIT, participant_input, inp.timeouts.phase_s, ATTEMPT_TRANSIENT),
            inp.engines)
        progress.participant_s += committed.participant_s + policy_committed.participant_s
        return committed, policy_committed

    async def _journal_attempt(self, inp: SnapshotAttemptInput, progress: AttemptProgress, participant_input: GymInput,
                               hold: TrainerHoldResult | None) -> SnapshotAttemptResult:
        """Nothing closes or parks: the environment servers mark their turn journals, then the cut and publish.
        The agents keep running; a restore continues each from its newest journaled boundary."""
        marked = await self._call(progress, "gym_mark", GYM_MARK, participant_input, inp.timeouts.phase_s,
                                  ATTEMPT_FEW_TRIES)
        progress.participant_s += marked.participant_s
        cut, published = await self._cut_and_publish(inp, progress, participant_input, hold, [], {}, marked.marks)
        result = self._published(inp, progress, Outcome.PUBLISHED, f"published {published.snapshot_dir}", cut,
                                 published)
        result.journaled_agents = cut.running_agents
        return result

    async def _cut_and_publish(self, inp: SnapshotAttemptInput, progress: AttemptProgress, participant_input: GymInput,
                               hold: TrainerHoldResult | None, artifacts: list, counts: dict,
                               marks: list | None = None) -> tuple[CutResult, PublishResult]:
        budget = inp.timeouts
        cut = await self._call(progress, "cut", CUT, CutInput(
            run_id=inp.run_id, checkpoint_id=inp.checkpoint_id, incarnation=inp.incarnation,
            staging_dir=participant_input.staging_dir, anchor_step=inp.anchor_step, hold=hold, marks=marks,
            checkpoint_hold=progress.checkpoint_hold_kept),
            budget.phase_s, ATTEMPT_TRANSIENT)
        counts = {**counts, "data_plane_rows": cut.data_plane_rows, "unfinished_groups": cut.unfinished_groups,
                  "continuations": cut.continuations}
        if marks is not None:
            counts["journaled_agents"] = cut.running_agents
        if progress.trainer_held:
            await self._release_trainer(inp, progress)
        elif progress.checkpoint_hold_kept:
            await self._after_kept_hold(inp, progress, cut)
        published = await self._call(progress, "publish", PUBLISH, PublishInput(
            run_id=inp.run_id, checkpoint_id=inp.checkpoint_id, incarnation=inp.incarnation,
            staging_dir=participant_input.staging_dir, anchor_step=inp.anchor_step, number=inp.number,
            policy_version=cut.policy_version, artifacts=artifacts + cut.artifacts,
            counts=counts, keep_latest_k=inp.keep_latest_k), budget.phase_s, ATTEMPT_TRANSIENT)
        progress.staging_dir = None  # renamed into place: nothing to discard any more
        return cut, published

    def _published(self, inp, progress: AttemptProgress, outcome: Outcome, reason: str, cut: CutResult,
                   published: PublishResult) -> SnapshotAttemptResult:
        result = self._result(inp, progress, outcome, reason)
        result.snapshot_dir = published.snapshot_dir
        result.bytes_written = published.bytes_written
        result.data_plane_rows = cut.data_plane_rows
        return result

    async def _after_kept_hold(self, inp: SnapshotAttemptInput, progress: AttemptProgress, cut: CutResult) -> None:
        """The cut released the checkpoint hold the attempt kept; if the trainer did not answer it, the trainer's
        own queue does (its worker may answer where Ray did not, and a retry is safe)."""
        if cut.checkpoint_hold_released:
            progress.trainer_wait_s = max(progress.trainer_wait_s, cut.trainer_wait_s)
        else:
            await self._release_trainer(inp, progress, [inp.checkpoint_hold])
        progress.checkpoint_hold_released = True

    @staticmethod
    def _keeps_checkpoint_hold(inp: SnapshotAttemptInput) -> bool:
        return (inp.agents == AgentsMode.JOURNAL and inp.trainer_hold and inp.checkpoint_hold is not None
                and workflow.patched(JOURNAL_KEEPS_CHECKPOINT_HOLD))

    async def _release_trainer(self, inp: SnapshotAttemptInput, progress: AttemptProgress,
                               holders: list[str] | None = None) -> None:
        released = await self._call(progress, "trainer_release", TRAINER_RELEASE,
                                    TrainerReleaseInput(holders=holders or [progress.holder]), inp.timeouts.phase_s,
                                    ATTEMPT_PERSISTENT)
        progress.trainer_wait_s = max(progress.trainer_wait_s, released.waited_s)
        progress.trainer_held = False

    async def _compensate(self, inp: SnapshotAttemptInput, progress: AttemptProgress) -> None:
        """Undo whatever the attempt did; every step is idempotent, so a retry is safe."""
        self._phase = "compensating"
        budget = inp.timeouts.phase_s
        if progress.participants_started:
            participant_input = GymInput(run_id=inp.run_id, checkpoint_id=inp.checkpoint_id,
                                         incarnation=inp.incarnation, lease_s=inp.timeouts.lease_s)
            await self._release(inp, progress, participant_input, budget, ATTEMPT_PERSISTENT, abort=True)
            progress.participants_started = False
        holders = [progress.holder] if progress.trainer_held else []
        if inp.checkpoint_hold and not progress.checkpoint_hold_released:
            # The train pump's checkpoint hold must not outlive an attempt that never took it over.
            holders.append(inp.checkpoint_hold)
        if holders:
            await self._release_trainer(inp, progress, holders)
        if progress.staging_dir is not None:
            await self._call(progress, "compensate", DISCARD_STAGING, DiscardStagingInput(
                checkpoint_id=inp.checkpoint_id, incarnation=inp.incarnation, staging_dir=progress.staging_dir),
                budget, ATTEMPT_PERSISTENT)
            progress.staging_dir = None

    async def _release(self, inp: SnapshotAttemptInput, progress: AttemptProgress, participant_input: GymInput,
                       timeout_s: float, retry, abort: bool) -> None:
        """The policy engines first, then the agents, then admission (reopened by the last)."""
        phase = "compensate" if abort else "resume"
        policy_call, env_call = ((POLICY_ABORT, GYM_ABORT) if abort else
                                 (POLICY_RESUME, GYM_RESUME))
        policy = engine_fanout.released(await self._on_engines(inp, progress, phase, policy_call, participant_input,
                                                                timeout_s, retry))
        released = await self._call(progress, phase, env_call, participant_input, timeout_s, retry)
        progress.participant_s += policy.participant_s + released.participant_s
        progress.admission_closed_s = released.admission_closed_s

    async def _on_engines(self, inp: SnapshotAttemptInput, progress: AttemptProgress, phase: str, step: Step,
                          participant_input: GymInput, timeout_s: float, retry, **options) -> list:
        """A policy step on every engine of the attempt at once (see `engine_fanout.fan_out`)."""
        self._phase = phase
        return await engine_fanout.fan_out(progress.phase_s, phase, inp.engines, lambda clock, engine: self._call(
            progress, phase, step, participant_input, timeout_s, retry, engine=engine, clock=clock, **options))

    async def _call(self, progress: AttemptProgress, phase: str, step: Step, arg, timeout_s: float, retry, *,
                    heartbeat_s: float | None = None, total_s: float | None = None, engine: int | None = None,
                    clock: dict[str, float] | None = None):
        """`step` as one activity; its seconds go to `clock` (the phase clock unless given)."""
        self._phase = phase
        local = step.runs is Runs.LOCAL and workflow.patched(LOCAL_CONTROLLER_PHASES)
        return await timed_activity(progress.phase_s if clock is None else clock, phase, step, arg, timeout_s, retry,
                                    run_id=progress.run_id, heartbeat_s=heartbeat_s, total_s=total_s, local=local,
                                    engine=engine)

    def _result(self, inp, progress: AttemptProgress, outcome: Outcome, reason: str) -> SnapshotAttemptResult:
        return SnapshotAttemptResult(
            checkpoint_id=inp.checkpoint_id, outcome=outcome, reason=reason, anchor_step=inp.anchor_step,
            trigger=inp.trigger, phase_s=dict(progress.phase_s), admission_closed_s=progress.admission_closed_s,
            participant_s=round(progress.participant_s, 3), trainer_wait_s=progress.trainer_wait_s,
            agents_parked_s=progress.agents_parked_s,
        )
