"""The controller's workflows, on a thread of their own with its own event loop and Temporal connection.

A workflow task is a few lines of code, but on the controller's event loop it waits behind
the pumps (HTTP to the servers, row stores, journal appends): `turnkeep bench orchestration`
measured most of an attempt's orchestration time there. Here the workflows (run, attempt,
recovery) are polled and run on a loop that does nothing else, while the controller's
activities stay on the main loop with the objects they work on. Both workers poll the
same task queue; Temporal hands workflow tasks only to the worker that registered
workflows, activity tasks only to the one with activities. The controller's short attempt
phases run here as local activities (`workers.temporal.loop_bridge` hands each call to the main
loop), so they cost no task-queue round trip and no workflow task of their own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence

from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from turnkeep.primitives.build_id import code_build_id
from turnkeep.primitives.temporal_client import connect
from turnkeep.schemas.config_services import TemporalSecurity
from turnkeep.workflows.retry_policies import STICKY_TASK_FALLBACK

log = logging.getLogger("turnkeep.snapshot")

START_TIMEOUT_S = 60.0

WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()
"""The run's workflows run outside the SDK's sandbox. The sandbox checks, on every activation, that workflow code
calls nothing nondeterministic; that costs each attempt (one workflow task, 5 local activities, so 6 activations)
about 12 ms of CPU on an idle machine, and with vLLM and the trainer on the same two cores it made the attempt's
orchestration 114 ms (median, 58 attempts) instead of 82 ms (59 attempts, `turnkeep bench orchestration`). The
checks still run where a change to workflow code is made: `tests/workflows/test_replay.py` replays every recorded
history in the sandbox, and the tests that run the workflows on workers of their own use the sandboxed default.
The `workflows` package keeps no module state between runs (the sandbox shared it across runs already)."""


class WorkflowThreadError(RuntimeError):
    """The workflow worker could not start (or stopped); the message says why."""


class WorkflowThread:
    def __init__(self, address: str, namespace: str, security: TemporalSecurity | None, task_queue: str,
                 workflows: Sequence[type], local_activities: Sequence = ()) -> None:
        self._connect = (address, namespace, security)
        self._task_queue = task_queue
        self._workflows = list(workflows)
        self._local_activities = list(local_activities)
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name=f"workflows:{task_queue}", daemon=True)

    async def start(self) -> None:
        """Connect and start polling; raises `WorkflowThreadError` with the cause if that fails."""
        self._thread.start()
        ready = await asyncio.to_thread(self._ready.wait, START_TIMEOUT_S)
        if self._failure is not None:
            raise WorkflowThreadError(f"the workflow worker did not start: {self._failure}") from self._failure
        if not ready:
            raise WorkflowThreadError(f"the workflow worker did not start within {START_TIMEOUT_S:.0f}s")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    async def stop(self) -> None:
        """Stop polling, let running workflow tasks finish, and join the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop closed meanwhile: the thread is ending by itself
                pass
        await asyncio.to_thread(self._thread.join, START_TIMEOUT_S)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as err:  # noqa: BLE001 - reported to start(), or logged when it happens later
            self._failure = err
            if self._ready.is_set():
                log.error("the workflow worker stopped: %s", err)
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        client = await connect(*self._connect)
        # no_remote_activities: the controller's activity tasks stay with the main loop's worker.
        worker = Worker(client, task_queue=self._task_queue, workflows=self._workflows, workflow_runner=WORKFLOW_RUNNER,
                        activities=self._local_activities, no_remote_activities=True,
                        sticky_queue_schedule_to_start_timeout=STICKY_TASK_FALLBACK, build_id=code_build_id())
        running = asyncio.ensure_future(worker.run())
        stopping = asyncio.ensure_future(self._stop.wait())
        self._ready.set()
        done, _ = await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if running in done:
            stopping.cancel()
            running.result()  # a fatal worker error: raised, and logged by _main
            raise WorkflowThreadError("the workflow worker stopped by itself")
        await worker.shutdown()
        await running
