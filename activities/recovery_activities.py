"""The recovery workflow's activities: close what the dead incarnation left open, choose
the source, restore, resume. They run on the controller's queue of the new incarnation."""

from __future__ import annotations

import asyncio
import logging

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from activities.errors import stale_incarnation
from controller.restore.crash_restore import CrashRestore, CrashRestoreError
from controller.restore.restore_source import UnusableRunDir
from schemas import search_attributes as sa
from schemas.names import Activity, ErrorType, WorkflowType
from schemas.recovery import (
    CancelStaleResult,
    ChooseSourceResult,
    RecoveryStepInput,
    RestoreInput,
    RestoreResult,
    ResumeAfterRestoreResult,
)

log = logging.getLogger("turnkeep.recovery")


class RecoveryActivities:
    def __init__(self, client: Client, recovery: CrashRestore, incarnation: int, wait_s: float) -> None:
        self._client = client
        self._recovery = recovery
        self._incarnation = incarnation
        self._wait_s = wait_s

    def _check(self, incarnation: int) -> None:
        if incarnation != self._incarnation:
            raise stale_incarnation(incarnation, self._incarnation)

    @activity.defn(name=Activity.RECOVERY_CANCEL_STALE)
    async def cancel_stale(self, inp: RecoveryStepInput) -> CancelStaleResult:
        """Cancel the run workflow and attempts the previous incarnation left open; wait until they close."""
        self._check(inp.incarnation)
        query = f"{sa.RUN_ID.name} = '{inp.run_id}' AND ExecutionStatus = 'Running'"
        own = activity.info().workflow_id
        stale = [(wf.id, wf.workflow_type) async for wf in self._client.list_workflows(query) if wf.id != own]
        handles = [self._client.get_workflow_handle(workflow_id) for workflow_id, _ in stale]
        for handle, (_, workflow_type) in zip(handles, stale):
            if workflow_type == WorkflowType.RUN:
                # A run workflow whose child attempt absorbs the cancel would go on; `stop` ends it either way.
                await handle.signal("stop", f"superseded by controller incarnation {inp.incarnation}")
            await handle.cancel()
        terminated = []
        for handle in handles:
            activity.heartbeat(f"waiting for {handle.id} to close")
            if not await self._closes(handle):
                await handle.terminate(reason=f"left open by a dead controller; incarnation {inp.incarnation} took over")
                terminated.append(handle.id)
        if stale:
            log.info("closed %d workflows of the previous incarnation (%d terminated)", len(stale), len(terminated))
        return CancelStaleResult(cancelled=[h.id for h in handles if h.id not in terminated], terminated=terminated)

    async def _closes(self, handle) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        while loop.time() < deadline:
            description = await handle.describe()
            if description.status != WorkflowExecutionStatus.RUNNING:
                return True
            activity.heartbeat(f"waiting for {handle.id} to close")
            await asyncio.sleep(0.25)
        return False

    @activity.defn(name=Activity.RECOVERY_CHOOSE_SOURCE)
    async def choose_source(self, inp: RecoveryStepInput) -> ChooseSourceResult:
        self._check(inp.incarnation)
        try:
            source = await asyncio.to_thread(self._recovery.choose)
        except UnusableRunDir as err:
            raise ApplicationError(str(err), type=ErrorType.UNUSABLE_RUN_DIR, non_retryable=True) from None
        return ChooseSourceResult(source=source)

    @activity.defn(name=Activity.RECOVERY_RESTORE)
    async def restore(self, inp: RestoreInput) -> RestoreResult:
        self._check(inp.incarnation)
        try:
            return await self._recovery.restore(inp.source)
        except CrashRestoreError as err:
            raise ApplicationError(str(err), type=ErrorType.CRASH_RESTORE_FAILED, non_retryable=True) from None

    @activity.defn(name=Activity.RECOVERY_RESUME)
    async def resume(self, inp: RecoveryStepInput) -> ResumeAfterRestoreResult:
        self._check(inp.incarnation)
        return ResumeAfterRestoreResult(admission_closed_s=await self._recovery.resume())
