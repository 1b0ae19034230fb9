"""The run workflow alone on a real Temporal dev server, with stand-in activities."""

from __future__ import annotations

import asyncio
import os
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from turnkeep.schemas import search_attributes as sa
from turnkeep.schemas.attempt_steps import (
    ANCHOR,
    RECORD,
    REQUEST_CHECKPOINT,
    AnchorQuery,
    AnchorResult,
    AttemptRecord,
    CheckpointRequest,
    CheckpointRequestResult,
    RecordResult,
)
from turnkeep.schemas.choices import Outcome, Trigger
from turnkeep.schemas.engine_steps import ENGINES_SCALE, ScaleEnginesInput, ScaleEnginesResult
from turnkeep.schemas.names import WorkflowType
from turnkeep.schemas.snapshot import (
    RunWorkflowInput,
    SetEnginesInput,
    SnapshotAttemptInput,
    SnapshotAttemptResult,
    SnapshotNowSignal,
    SnapshotTimeouts,
)
from turnkeep.workers.temporal.dev_server import UNTHROTTLED, temporal_binary
from turnkeep.workflows.run_workflow import RunWorkflow

HISTORY_DIR = Path(__file__).parent / "histories"


pytestmark = pytest.mark.integration  # a real Temporal dev server per test


async def _dev_server() -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), data_converter=pydantic_data_converter,
        search_attributes=sa.ALL,
        dev_server_extra_args=[arg for value in UNTHROTTLED for arg in ("--dynamic-config-value", value)],
    )


def _run_input(attempt_interval_s: float | None, engines: list[int] | None = None) -> RunWorkflowInput:
    return RunWorkflowInput(run_id="r", incarnation=1, attempt_interval_s=attempt_interval_s, max_consecutive_failures=3,
                            keep_latest_k=2, timeouts=SnapshotTimeouts(prepare_s=5, phase_s=5, lease_s=5),
                            engines=engines)


class StandIns:
    def __init__(self):
        self.requests: list[str] = []

    @activity.defn(name=ANCHOR)
    async def anchor(self, inp: AnchorQuery) -> AnchorResult:
        return AnchorResult(current_step=5, newest_checkpoint_step=4)

    @activity.defn(name=REQUEST_CHECKPOINT)
    async def request_checkpoint(self, inp: CheckpointRequest) -> CheckpointRequestResult:
        self.requests.append(str(inp.trigger))
        return CheckpointRequestResult()

    @activity.defn(name=RECORD)
    async def record(self, inp: AttemptRecord) -> RecordResult:
        return RecordResult()


@asynccontextmanager
async def _started_run(stand_ins: StandIns, attempt_interval_s: float | None, extra_workflows: tuple = (),
                       engines: list[int] | None = None):
    """A run workflow on a dev server of its own, its worker serving `stand_ins`' activities."""
    async with await _dev_server() as env:
        queue = f"q-{uuid.uuid4().hex[:6]}"
        async with Worker(env.client, task_queue=queue, workflows=[RunWorkflow, *extra_workflows],
                          activities=[stand_ins.anchor, stand_ins.request_checkpoint, stand_ins.record,
                                      *([stand_ins.scale] if hasattr(stand_ins, "scale") else [])]):
            yield await env.client.start_workflow(RunWorkflow.run, _run_input(attempt_interval_s, engines),
                                                  id=f"r.run.{queue}", task_queue=queue)


def test_pause_stops_periodic_attempts_and_the_status_query_shows_it():
    async def scenario():
        stand_ins = StandIns()
        async with _started_run(stand_ins, attempt_interval_s=0.3) as handle:
            while not stand_ins.requests:
                await asyncio.sleep(0.05)
            await handle.signal(RunWorkflow.pause_snapshots)
            while not (status := await handle.query(RunWorkflow.status)).paused:
                await asyncio.sleep(0.05)
            seen = len(stand_ins.requests)
            await asyncio.sleep(1.0)
            paused_requests = len(stand_ins.requests) - seen
            await handle.signal(RunWorkflow.resume_snapshots)
            while len(stand_ins.requests) == seen + paused_requests:
                await asyncio.sleep(0.05)
            await handle.signal(RunWorkflow.stop, "test over")
            result = await handle.result()
        return status, paused_requests, stand_ins.requests, result

    status, paused_requests, requests, result = asyncio.run(scenario())
    assert status.paused and status.run_id == "r"
    assert paused_requests <= 1  # at most one that was already on its way
    assert set(requests) == {"periodic"}
    assert result.stopped_reason == "test over"


def test_without_an_interval_only_a_trigger_starts_an_attempt():
    """Journaled agents by default: attempts at trainer checkpoints and on request, no periodic timer."""
    async def scenario():
        stand_ins = StandIns()
        async with _started_run(stand_ins, attempt_interval_s=None) as handle:
            await asyncio.sleep(1.5)
            before_signal = list(stand_ins.requests)
            await handle.signal(RunWorkflow.snapshot_now, SnapshotNowSignal(reason="look"))
            while not stand_ins.requests:
                await asyncio.sleep(0.05)
            await handle.signal(RunWorkflow.stop, "test over")
            await handle.result()
            timers = [e for e in (await handle.fetch_history()).events if e.HasField("timer_started_event_attributes")]
        return before_signal, stand_ins.requests, timers

    before_signal, requests, timers = asyncio.run(scenario())
    assert before_signal == [] and requests == ["operator"] and timers == []


def _run_workflow_state() -> RunWorkflow:
    # The signal handlers are plain methods over the workflow's queue: check them without a server.
    return RunWorkflow(_run_input(attempt_interval_s=20))


def test_a_checkpoint_announced_again_for_a_waiting_request_upgrades_the_queued_attempt():
    from turnkeep.schemas.choices import Trigger
    from turnkeep.schemas.snapshot import TrainerCheckpointSignal

    run = _run_workflow_state()
    run._requested = Trigger.PREEMPTION  # the preemption attempt asked for a checkpoint ...
    run.trainer_checkpoint_saved(TrainerCheckpointSignal(step=40))  # ... and save_period's came first
    run.trainer_checkpoint_saved(TrainerCheckpointSignal(step=40, trigger=Trigger.PREEMPTION, repeat=True))
    assert [(t.trigger, t.step, t.held) for t in run._triggers] == [(Trigger.PREEMPTION, 40, True)]


def test_a_repeat_announcement_nobody_waits_for_starts_no_attempt():
    from turnkeep.schemas.choices import Trigger
    from turnkeep.schemas.snapshot import TrainerCheckpointSignal

    run = _run_workflow_state()
    run.trainer_checkpoint_saved(TrainerCheckpointSignal(step=7, trigger=Trigger.PERIODIC, repeat=True))
    assert not run._triggers
    run._requested = Trigger.OPERATOR  # the checkpoint's own attempt already ran; the request needs another
    run.trainer_checkpoint_saved(TrainerCheckpointSignal(step=7, trigger=Trigger.OPERATOR, repeat=True))
    assert [(t.trigger, t.step, t.held) for t in run._triggers] == [(Trigger.OPERATOR, 7, False)]
    assert run._requested is None


def test_an_attempt_anchored_at_a_queued_checkpoint_serves_it_and_takes_its_hold(monkeypatch):
    """A save_period checkpoint queued while a preemption's attempt waited for its anchor: one attempt under that
    step, not a second one right after it in the grace period (a CI run restored from that second one)."""
    from turnkeep.schemas.choices import Trigger
    from turnkeep.schemas.snapshot import TrainerCheckpointSignal
    from turnkeep.workflows import run_workflow

    monkeypatch.setattr(run_workflow.workflow, "patched", lambda patch_id: True)
    run = _run_workflow_state()
    run.trainer_checkpoint_saved(TrainerCheckpointSignal(step=12))
    run.snapshot_now(SnapshotNowSignal(reason="SIGTERM", preemption=True))
    assert run._take_queued(11) is None and len(run._triggers) == 2
    taken = run._take_queued(12)
    assert (taken.trigger, taken.held) == (Trigger.TRAINER_CHECKPOINT, True)  # the train pump's hold goes along
    assert [(t.trigger, t.step) for t in run._triggers] == [(Trigger.PREEMPTION, None)]


@workflow.defn(name=WorkflowType.SNAPSHOT_ATTEMPT, sandboxed=False)
class OutrunOnceAttempt:
    """Stands in for an attempt: the first is skipped (the trainer outran its hold), the next publishes."""

    @workflow.run
    async def run(self, inp: SnapshotAttemptInput) -> SnapshotAttemptResult:
        outcome = Outcome.SKIPPED if inp.number == 1 else Outcome.PUBLISHED
        return SnapshotAttemptResult(checkpoint_id=inp.checkpoint_id, outcome=outcome, reason=f"attempt {inp.number}",
                                     anchor_step=inp.anchor_step, trigger=inp.trigger,
                                     snapshot_dir=f"snapshots/{inp.number}" if outcome is Outcome.PUBLISHED else None)


class AtACheckpoint(StandIns):
    @activity.defn(name=ANCHOR)
    async def anchor(self, inp: AnchorQuery) -> AnchorResult:
        return AnchorResult(current_step=5, newest_checkpoint_step=5)


def test_snapshot_and_wait_answers_what_was_saved_and_asks_again_after_a_skip():
    async def scenario():
        async with _started_run(AtACheckpoint(), attempt_interval_s=600, extra_workflows=(OutrunOnceAttempt,)) as handle:
            saved = await handle.execute_update(
                RunWorkflow.snapshot_and_wait, SnapshotNowSignal(reason="SIGTERM", preemption=True)
            )
            status = await handle.query(RunWorkflow.status)
            await handle.signal(RunWorkflow.stop, "test over")
            await handle.result()
            if os.environ.get("TURNKEEP_RECORD_HISTORIES"):
                history = await handle.fetch_history()
                (HISTORY_DIR / f"TurnkeepRun-{handle.id}.json").write_text(history.to_json())
        return saved, status

    saved, status = asyncio.run(scenario())
    assert saved.outcome is Outcome.PUBLISHED and saved.trigger is Trigger.PREEMPTION
    assert saved.checkpoint_id == "r.snapshot.5.2" and saved.snapshot_dir == "snapshots/2"
    assert status.attempts_by_outcome == {"skipped": 1, "published": 1}


@workflow.defn(name=WorkflowType.SNAPSHOT_ATTEMPT, sandboxed=False)
class EngineEchoAttempt:
    """Stands in for an attempt: publishes, its reason naming the engines it was asked to fence."""

    @workflow.run
    async def run(self, inp: SnapshotAttemptInput) -> SnapshotAttemptResult:
        return SnapshotAttemptResult(checkpoint_id=inp.checkpoint_id, outcome=Outcome.PUBLISHED,
                                     reason=f"engines {inp.engines}", anchor_step=inp.anchor_step,
                                     trigger=inp.trigger)


class ScalingController(AtACheckpoint):
    """The controller's side of `set_engines`: records the lists it was asked for and has them at once."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[int]] = []

    @activity.defn(name=ENGINES_SCALE)
    async def scale(self, inp: ScaleEnginesInput) -> ScaleEnginesResult:
        self.asked.append(inp.engines)
        return ScaleEnginesResult(engines=inp.engines, started=[k for k in inp.engines if k > 0], retired=[],
                                  seconds=0.5)


def test_set_engines_refuses_a_bad_list_and_the_next_attempt_fences_the_new_one():
    controller = ScalingController()

    async def scenario():
        async with _started_run(controller, attempt_interval_s=600, extra_workflows=(EngineEchoAttempt,),
                                engines=[0]) as handle:
            refusals = []
            for engines in ([], [0, 1, 0], [2, -1], list(range(257))):
                with pytest.raises(WorkflowUpdateFailedError) as refused:
                    await handle.execute_update(RunWorkflow.set_engines, SetEnginesInput(engines=engines))
                refusals.append(str(refused.value.cause))
            before = await handle.execute_update(RunWorkflow.snapshot_and_wait, SnapshotNowSignal(reason="before"))
            changed = await handle.execute_update(RunWorkflow.set_engines, SetEnginesInput(engines=[0, 1, 2]))
            after = await handle.execute_update(RunWorkflow.snapshot_and_wait, SnapshotNowSignal(reason="after"))
            await handle.signal(RunWorkflow.stop, "test over")
            await handle.result()
        return refusals, before, changed, after

    refusals, before, changed, after = asyncio.run(scenario())
    assert "at least one" in refusals[0] and "more than once: [0]" in refusals[1]
    assert "negative" in refusals[2] and "257 policy engines" in refusals[3]
    assert before.reason == "engines [0]"
    assert changed.previous == [0] and changed.engines == [0, 1, 2] and changed.started == [1, 2]
    assert controller.asked == [[0, 1, 2]]  # refused lists never reached the controller
    assert after.reason == "engines [0, 1, 2]"
