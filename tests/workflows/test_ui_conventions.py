"""What the Temporal UI shows, on a real dev server with stand-in activities: an attempt cancelled from the CLI
or the UI compensates and ends as Canceled (its outcome, parked agents and closed seconds in its search
attributes, its full result recorded by the run), a cancel that lands during compensation lets it finish, and a
recovery a newer incarnation superseded completes with
the reason instead of failing."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from temporalio import activity
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from tests.workflows.test_run_workflow import _dev_server, _run_input
from turnkeep.schemas import search_attributes as sa
from turnkeep.schemas.attempt_steps import (
    ANCHOR,
    DISCARD_STAGING,
    GYM_ABORT,
    GYM_PREPARE,
    OPEN_STAGING,
    POLICY_ABORT,
    PREFLIGHT,
    RECORD,
    TRAINER_HOLD,
    TRAINER_RELEASE,
    AnchorQuery,
    AnchorResult,
    AttemptRecord,
    GymInput,
    GymPrepareResult,
    GymReleaseResult,
    PreflightInput,
    PreflightResult,
    RecordResult,
    StagingInput,
    StagingResult,
    TrainerHoldInput,
    TrainerHoldResult,
    TrainerReleaseInput,
    TrainerReleaseResult,
)
from turnkeep.schemas.eval_steps import EVAL_REQUEST, EvalRequestInput, EvalRequestResult
from turnkeep.schemas.names import ErrorType, controller_queue, policy_queue, trainer_queue
from turnkeep.schemas.recovery import RECOVERY_CANCEL_STALE, CancelStaleResult, RecoveryInput, RecoveryStepInput
from turnkeep.workflows.recovery_workflow import RecoveryWorkflow
from turnkeep.workflows.run_workflow import RunWorkflow
from turnkeep.workflows.snapshot_attempt import SnapshotAttemptWorkflow

RUN = "r"


class Participants:
    """The attempt's activities up to a prepare that never finishes, and the compensations."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.records: list[AttemptRecord] = []
        self.evaluations: list[str] = []
        self.preparing = asyncio.Event()

    @activity.defn(name=ANCHOR)
    async def anchor(self, inp: AnchorQuery) -> AnchorResult:
        return AnchorResult(current_step=4, newest_checkpoint_step=4)

    @activity.defn(name=PREFLIGHT)
    async def preflight(self, inp: PreflightInput) -> PreflightResult:
        return PreflightResult(skip_reason=None)

    @activity.defn(name=OPEN_STAGING)
    async def open_staging(self, inp: StagingInput) -> StagingResult:
        return StagingResult(staging_dir="/nowhere/.staging-4")

    @activity.defn(name=GYM_PREPARE)
    async def gym_prepare(self, inp: GymInput) -> GymPrepareResult:
        self.preparing.set()
        while True:  # parks agents until it is cancelled
            activity.heartbeat()
            await asyncio.sleep(0.2)

    @activity.defn(name=GYM_ABORT)
    async def gym_abort(self, inp: GymInput) -> GymReleaseResult:
        self.calls.append("gym.abort")
        return GymReleaseResult(participant_s=0.01, admission_closed_s=1.25)

    @activity.defn(name=POLICY_ABORT)
    async def policy_abort(self, inp: GymInput) -> GymReleaseResult:
        self.calls.append("policy.abort")
        return GymReleaseResult(participant_s=0.01, admission_closed_s=0.0)

    @activity.defn(name=DISCARD_STAGING)
    async def discard_staging(self, inp) -> None:
        self.calls.append("discard_staging")

    @activity.defn(name=TRAINER_HOLD)
    async def trainer_hold(self, inp: TrainerHoldInput) -> TrainerHoldResult:
        return TrainerHoldResult(step=4, policy_version=4)

    @activity.defn(name=TRAINER_RELEASE)
    async def trainer_release(self, inp: TrainerReleaseInput) -> TrainerReleaseResult:
        self.calls.append("trainer.release")
        return TrainerReleaseResult(released=True, waited_s=0.0)

    @activity.defn(name=RECORD)
    async def record(self, inp: AttemptRecord) -> RecordResult:
        self.records.append(inp)
        return RecordResult()

    @activity.defn(name=EVAL_REQUEST)
    async def eval_request(self, inp: EvalRequestInput) -> EvalRequestResult:
        self.evaluations.append(inp.reason)
        return EvalRequestResult(step=4, note="evaluation of step 4 queued (1 waiting)")

    def controller(self) -> list:
        return [self.anchor, self.preflight, self.open_staging, self.gym_prepare, self.gym_abort,
                self.discard_staging, self.record, self.eval_request]

    @contextlib.asynccontextmanager
    async def workers(self, client):
        """The controller's, the trainer's and the policy server's workers, each on its own queue."""
        async with (Worker(client, task_queue=controller_queue(RUN), workflows=[RunWorkflow, SnapshotAttemptWorkflow],
                           activities=self.controller()),
                    Worker(client, task_queue=trainer_queue(RUN), activities=[self.trainer_hold,
                                                                               self.trainer_release]),
                    Worker(client, task_queue=policy_queue(RUN), activities=[self.policy_abort])):
            yield


async def _attempt_when(client, ready: asyncio.Event):
    """A run workflow asked for a snapshot now, and its attempt's handle once the participants set `ready`."""
    run = await client.start_workflow(RunWorkflow.run, _run_input(attempt_interval_s=600),
                                      id=f"{RUN}.run.{uuid.uuid4().hex[:6]}", task_queue=controller_queue(RUN))
    await run.signal(RunWorkflow.snapshot_now)
    await asyncio.wait_for(ready.wait(), 30)
    return run, client.get_workflow_handle((await run.query(RunWorkflow.status)).running_attempt)


def test_a_cancelled_attempt_compensates_ends_canceled_and_the_run_records_its_result():
    async def scenario():
        async with await _dev_server() as env:
            parts = Participants()
            client = env.client
            async with parts.workers(client):
                run, attempt = await _attempt_when(client, parts.preparing)
                await attempt.cancel()  # what `temporal workflow cancel --workflow-id <id>` does
                while not parts.records:
                    await asyncio.sleep(0.05)
                described = await attempt.describe()
                await run.signal(RunWorkflow.stop, "test over")
                await run.result()
        return described, parts

    described, parts = asyncio.run(scenario())
    assert described.status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CANCELED
    attributes = described.typed_search_attributes
    assert attributes.get(sa.OUTCOME) == "aborted"
    assert attributes.get(sa.CLOSED_S) == 1.25 and attributes.get(sa.PARKED_AGENTS) == 0
    assert parts.calls[:2] == ["policy.abort", "gym.abort"] and "trainer.release" in parts.calls
    assert "discard_staging" in parts.calls
    [record] = parts.records
    result = record.result
    assert result.outcome == "aborted" and result.reason.startswith("cancelled (temporal workflow cancel")
    assert "compensate" in result.phase_s and result.admission_closed_s == 1.25  # the attempt's own result


class FailingParticipants(Participants):
    """A prepare that fails, and a policy abort that waits to be let go: a cancel lands during compensation."""

    def __init__(self) -> None:
        super().__init__()
        self.aborting = asyncio.Event()
        self.let_abort_go = asyncio.Event()

    @activity.defn(name=GYM_PREPARE)
    async def gym_prepare(self, inp: GymInput) -> GymPrepareResult:
        raise ApplicationError("an environment server refused prepare", non_retryable=True)

    @activity.defn(name=POLICY_ABORT)
    async def policy_abort(self, inp: GymInput) -> GymReleaseResult:
        self.aborting.set()
        await self.let_abort_go.wait()
        return await super().policy_abort(inp)


def test_a_cancel_during_compensation_waits_for_it_and_the_run_records_the_failure_at_once():
    """What a newer controller incarnation does to an attempt the dead one left failing: compensation still runs
    to its end (every participant released, staging discarded) and the run gets the result without waiting out
    its 10 s fallback."""
    async def scenario():
        async with await _dev_server() as env:
            parts = FailingParticipants()
            client = env.client
            async with parts.workers(client):
                run, attempt = await _attempt_when(client, parts.aborting)
                await attempt.cancel()
                await asyncio.sleep(0.5)  # the cancel is in the attempt's history while the abort runs
                parts.let_abort_go.set()
                loop = asyncio.get_running_loop()
                cancelled_at = loop.time()
                while not parts.records:
                    await asyncio.sleep(0.05)
                recorded_after_s = loop.time() - cancelled_at
                described = await attempt.describe()
                await run.signal(RunWorkflow.stop, "test over")
                await run.result()
        return described, parts, recorded_after_s

    described, parts, recorded_after_s = asyncio.run(scenario())
    assert described.status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CANCELED
    assert parts.calls[:2] == ["policy.abort", "gym.abort"] and "trainer.release" in parts.calls
    assert "discard_staging" in parts.calls
    [record] = parts.records
    assert record.result.outcome == "failed" and "refused prepare" in record.result.reason, record.result
    assert recorded_after_s < 5.0  # handed over, not the run's 10 s fallback


def test_a_superseded_recovery_completes_with_the_reason_instead_of_failing():
    @activity.defn(name=RECOVERY_CANCEL_STALE)
    async def cancel_stale(inp: RecoveryStepInput) -> CancelStaleResult:
        raise ApplicationError("activity from controller incarnation 2 refused: this controller is incarnation 3",
                               type=ErrorType.STALE_INCARNATION, non_retryable=True)

    async def scenario():
        async with await _dev_server() as env:
            queue = f"q-{uuid.uuid4().hex[:6]}"
            async with Worker(env.client, task_queue=queue, workflows=[RecoveryWorkflow], activities=[cancel_stale]):
                handle = await env.client.start_workflow(
                    RecoveryWorkflow.run, RecoveryInput(run_id=RUN, incarnation=2, phase_timeout_s=5),
                    id=f"{RUN}.recovery.2.{queue}", task_queue=queue)
                result = await handle.result()
                return result, await handle.describe()

    result, described = asyncio.run(scenario())
    assert described.status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_COMPLETED
    assert result.source is None and "this controller is incarnation 3" in result.superseded
    assert described.typed_search_attributes.get(sa.RESTORE_SOURCE) == "superseded"
