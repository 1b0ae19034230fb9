"""Local activities on the workflow thread run the controller's activity code on the controller's loop: with the
activity's context, with its errors, and to its end when the workflow gives up on it."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError

from tests.workers.temporal.echo_workflow import ECHO_LOCAL, LocalEchoWorkflow
from turnkeep.primitives.temporal_client import connect
from turnkeep.workers.temporal.loop_bridge import BridgedRun, bridged_activities, on_loop
from turnkeep.workers.temporal.workflow_thread import WorkflowThread


class Controller:
    def __init__(self) -> None:
        self.seen: list[tuple[int, str, bool]] = []

    @activity.defn(name=ECHO_LOCAL)
    async def shout(self, text: str) -> str:
        info = activity.info()  # the activity's context came along with the call
        self.seen.append((threading.get_ident(), info.activity_type, info.is_local))
        if text == "fail":
            raise ApplicationError("refused: the text 'fail'", non_retryable=True)
        return text.upper()

    @activity.defn(name="test.other")
    async def other(self, text: str) -> str:
        return text


@pytest.mark.integration
def test_a_local_activity_on_the_workflow_thread_runs_on_the_controller_loop(temporal_address):
    controller = Controller()
    recorded: list[tuple[int, BridgedRun]] = []

    async def scenario() -> list[str]:
        queue = f"test-{uuid.uuid4().hex[:6]}"
        local = bridged_activities([controller.shout, controller.other], [ECHO_LOCAL], asyncio.get_running_loop(),
                                   lambda run: recorded.append((threading.get_ident(), run)))
        workflows = WorkflowThread(temporal_address, "default", None, queue, [LocalEchoWorkflow], local)
        await workflows.start()
        try:
            client = await connect(temporal_address, "default")
            return [await client.execute_workflow(LocalEchoWorkflow.run, text, id=f"echo-{queue}-{text}",
                                                  task_queue=queue) for text in ("hello", "fail")]
        finally:
            await workflows.stop()

    assert asyncio.run(scenario()) == ["HELLO", "failed: refused: the text 'fail'"]
    assert controller.seen == [(threading.get_ident(), ECHO_LOCAL, True)] * 2
    # Each call's clocks reach the controller's loop, failed calls too, named by their workflow.
    assert [(thread, run.activity, run.workflow_id.rsplit("-", 1)[1], run.attempt) for thread, run in recorded] == [
        (threading.get_ident(), ECHO_LOCAL, "hello", 1), (threading.get_ident(), ECHO_LOCAL, "fail", 1)]
    assert all(run.workflow_run_id and 0 <= run.run_s <= run.wall_s and 0 <= run.loop_wait_s <= run.wall_s
               for _, run in recorded)


def test_only_the_named_activities_are_bridged_and_a_missing_name_is_refused():
    controller = Controller()
    loop = asyncio.new_event_loop()
    try:
        [bridged] = bridged_activities([controller.shout, controller.other], [ECHO_LOCAL], loop)
        assert bridged.__temporal_activity_definition.name == ECHO_LOCAL
        with pytest.raises(ValueError, match=r"no controller activity is named \['test.gone'\]"):
            bridged_activities([controller.shout], [ECHO_LOCAL, "test.gone"], loop)
    finally:
        loop.close()


def test_cancelling_the_call_cancels_the_task_on_the_other_loop():
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    outcome: dict[str, str] = {}
    began = threading.Event()

    async def forever() -> None:
        began.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            outcome["task"] = "cancelled"
            raise

    async def caller() -> None:
        call = asyncio.wrap_future(on_loop(other, forever()))
        await asyncio.to_thread(began.wait, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    try:
        asyncio.run(caller())
        for _ in range(100):
            if outcome:
                break
            threading.Event().wait(0.02)
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(5)
    assert outcome == {"task": "cancelled"}


class SlowPhase:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.began = threading.Event()

    @activity.defn(name="test.slow_phase")
    async def run(self, text: str) -> str:
        self.began.set()
        await asyncio.sleep(0.3)
        self.events.append("phase finished")
        return text


def test_a_cancelled_caller_waits_for_the_started_phase_to_finish():
    """The compensation that follows a cancellation must not race a publish still running on the controller."""
    phase = SlowPhase()
    controller = asyncio.new_event_loop()
    thread = threading.Thread(target=controller.run_forever, daemon=True)
    thread.start()

    async def workflow_side() -> None:
        [bridged] = bridged_activities([phase.run], ["test.slow_phase"], controller)
        call = asyncio.ensure_future(bridged("x"))
        await asyncio.to_thread(phase.began.wait, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        phase.events.append("caller saw the cancellation")

    try:
        asyncio.run(workflow_side())
    finally:
        controller.call_soon_threadsafe(controller.stop)
        thread.join(5)
    assert phase.events == ["phase finished", "caller saw the cancellation"]
