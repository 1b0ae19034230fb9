"""The controller's workflows on a thread of their own: they run there while the controller's loop is busy,
stop with it, and a worker that cannot start says why in one line."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from tests.workers.temporal.echo_workflow import EchoWorkflow
from turnkeep.primitives.temporal_client import connect
from turnkeep.workers.temporal.workflow_thread import WorkflowThread, WorkflowThreadError

pytestmark = pytest.mark.integration


def test_workflows_run_on_their_thread_while_the_main_loop_is_busy(temporal_address):
    async def scenario() -> tuple[str, float]:
        queue = f"test-{uuid.uuid4().hex[:6]}"
        workflows = WorkflowThread(temporal_address, "default", None, queue, [EchoWorkflow])
        await workflows.start()
        assert workflows.alive
        client = await connect(temporal_address, "default")
        handle = await client.start_workflow(EchoWorkflow.run, "hello", id=f"echo-{queue}", task_queue=queue)
        # The main loop is held for a second: a workflow task on it would wait that long; this one does not.
        outside: dict = {}

        def wait_outside() -> None:
            async def result() -> None:
                other = await connect(temporal_address, "default")
                began = time.monotonic()
                outside["result"] = await other.get_workflow_handle(handle.id).result()
                outside["waited_s"] = time.monotonic() - began

            asyncio.run(result())

        waiter = threading.Thread(target=wait_outside)
        waiter.start()
        time.sleep(1.0)  # blocks this loop
        await asyncio.to_thread(waiter.join, 30)
        await workflows.stop()
        assert not workflows.alive
        return outside["result"], outside["waited_s"]

    result, waited_s = asyncio.run(scenario())
    assert result == "HELLO"
    assert waited_s < 1.0, f"the workflow waited {waited_s:.2f}s for the blocked main loop"


def test_a_worker_that_cannot_connect_fails_its_start_with_the_cause():
    async def scenario() -> None:
        workflows = WorkflowThread("127.0.0.1:1", "default", None, "test-nowhere", [EchoWorkflow])
        await workflows.start()

    with pytest.raises(WorkflowThreadError, match="the workflow worker did not start: "):
        asyncio.run(scenario())
