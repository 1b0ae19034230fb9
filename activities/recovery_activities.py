"""The recovery workflow's activities: close what the dead incarnation left open, choose
the source, restore, resume. They run on the controller's queue of the new incarnation.

Each checks its input before anything moves (see `activities.snapshot_activities`): the
run id must be this run's (it goes into the visibility query whose workflows are
cancelled), and every path of the source to restore must resolve inside this run's
checkpoint root, where `choose_source` finds them.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from turnkeep.activities.errors import stale_incarnation
from turnkeep.activities.input_checks import check_int, check_run_id, refused, resolved_inside
from turnkeep.controller.restore.crash_restore import CrashRestore, CrashRestoreError
from turnkeep.controller.restore.unusable import UnusableRunDir
from turnkeep.controller.restore.verify import SNAPSHOT_CONTROLLER_STATE
from turnkeep.controller.stores.trainer_checkpoint import CONTROLLER_STATE, checkpoint_root
from turnkeep.primitives import snapshot_paths
from turnkeep.schemas import search_attributes as sa
from turnkeep.schemas.names import ErrorType, WorkflowType
from turnkeep.schemas.recovery import (
    RECOVERY_CANCEL_STALE,
    RECOVERY_CHOOSE_SOURCE,
    RECOVERY_RESTORE,
    RECOVERY_RESUME,
    CancelStaleResult,
    ChooseSourceResult,
    RecoverySource,
    RecoveryStepInput,
    RestoreInput,
    RestoreResult,
    ResumeAfterRestoreResult,
    SourceKind,
)

log = logging.getLogger("turnkeep.recovery")


class RecoveryActivities:
    def __init__(self, client: Client, recovery: CrashRestore, incarnation: int, wait_s: float,
                 run_id: str | None = None, run_dir: Path | None = None) -> None:
        """`run_id` and `run_dir` default to the ones `recovery` restores."""
        self._client = client
        self._recovery = recovery
        self._incarnation = incarnation
        self._wait_s = wait_s
        self._run_id = run_id if run_id is not None else recovery._identity.run_id
        self._run_dir = Path(run_dir if run_dir is not None else recovery._cfg.run.run_dir)

    def _check(self, incarnation: int, run_id: str) -> None:
        if incarnation != self._incarnation:
            raise stale_incarnation(incarnation, self._incarnation)
        check_run_id("run_id", run_id, self._run_id)

    async def _unstick(self, workflow_id: str, run_id: str | None) -> None:
        """The dead controller's worker had the workflow cached on its own (sticky) queue; without this its next
        task (the cancel) would wait out the sticky timeout before any live worker may take it."""
        request = ResetStickyTaskQueueRequest(namespace=self._client.namespace,
                                              execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id or ""))
        try:
            await self._client.workflow_service.reset_sticky_task_queue(request)
        except RPCError as err:
            log.info("could not reset the sticky queue of %s (%s); its cancel may wait a few seconds", workflow_id, err)

    @activity.defn(name=RECOVERY_CANCEL_STALE)
    async def cancel_stale(self, inp: RecoveryStepInput) -> CancelStaleResult:
        """Cancel the run workflow and attempts the previous incarnation left open; wait until they close."""
        self._check(inp.incarnation, inp.run_id)  # the run id goes into the query: only this run's workflows
        query = f"{sa.RUN_ID.name} = '{inp.run_id}' AND ExecutionStatus = 'Running'"
        own = activity.info().workflow_id
        listed = [wf async for wf in self._client.list_workflows(query) if wf.id != own]
        stale = [(wf.id, wf.workflow_type) for wf in listed]
        for wf in listed:
            await self._unstick(wf.id, wf.run_id)
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

    @activity.defn(name=RECOVERY_CHOOSE_SOURCE)
    async def choose_source(self, inp: RecoveryStepInput) -> ChooseSourceResult:
        self._check(inp.incarnation, inp.run_id)
        try:
            source = await asyncio.to_thread(self._recovery.choose)
        except UnusableRunDir as err:
            raise ApplicationError(str(err), type=ErrorType.UNUSABLE_RUN_DIR, non_retryable=True) from None
        return ChooseSourceResult(source=source)

    @activity.defn(name=RECOVERY_RESTORE)
    async def restore(self, inp: RestoreInput) -> RestoreResult:
        self._check(inp.incarnation, inp.run_id)
        check_source(inp.source, self._run_dir)
        try:
            return await self._recovery.restore(inp.source)
        except CrashRestoreError as err:
            raise ApplicationError(str(err), type=ErrorType.CRASH_RESTORE_FAILED, non_retryable=True) from None

    @activity.defn(name=RECOVERY_RESUME)
    async def resume(self, inp: RecoveryStepInput) -> ResumeAfterRestoreResult:
        self._check(inp.incarnation, inp.run_id)
        return ResumeAfterRestoreResult(admission_closed_s=await self._recovery.resume())


def check_source(source: RecoverySource, run_dir: Path) -> None:
    """Every path `restore` reads, renames or hands to a participant lies where `choose_source` puts it:
    the checkpoint `checkpoints/step_<step>`, its snapshot `snapshots/<n>`, the controller state and the
    agents files inside those, and the skipped candidates inside the checkpoint root."""
    check_int("source.step", source.step, 0)
    check_int("source.policy_version", source.policy_version, 0)
    root = checkpoint_root(run_dir)
    inside_root = f"the run's checkpoint root {root}"
    for i, skipped in enumerate(source.skipped):
        resolved_inside(f"source.skipped[{i}].path", skipped.path, root, run_dir, inside_root)
    if source.kind is SourceKind.FRESH:
        given = {"checkpoint_dir": source.checkpoint_dir, "snapshot_dir": source.snapshot_dir,
                 "controller_state": source.controller_state, "agents_files": source.agents_files or None}
        for field, value in given.items():
            if value is not None:
                raise refused(f"source.{field}", value, "nothing for a fresh start")
        return
    checkpoint = resolved_inside("source.checkpoint_dir", source.checkpoint_dir, root, run_dir, inside_root)
    step_dir = root.resolve() / f"step_{source.step}"
    if checkpoint != step_dir:
        raise refused("source.checkpoint_dir", source.checkpoint_dir,
                      f"the checkpoint of source.step, {step_dir}; it resolves to {checkpoint}")
    if source.kind is SourceKind.TRAINER_CHECKPOINT:
        if source.snapshot_dir is not None or source.agents_files:
            field = "snapshot_dir" if source.snapshot_dir is not None else "agents_files"
            raise refused(f"source.{field}", getattr(source, field), "nothing for a trainer checkpoint source")
        state = checkpoint / CONTROLLER_STATE
    else:
        snapshots = step_dir / "snapshots"
        snapshot = resolved_inside("source.snapshot_dir", source.snapshot_dir, snapshots, run_dir,
                                   f"the snapshots of {step_dir}")
        if snapshot.parent != snapshots or not snapshot_paths.NUMBER.fullmatch(snapshot.name):
            raise refused("source.snapshot_dir", source.snapshot_dir,
                          f"a published snapshot {snapshots}/<n>; it resolves to {snapshot}")
        state = snapshot / SNAPSHOT_CONTROLLER_STATE
        for i, path in enumerate(source.agents_files):
            agents = resolved_inside(f"source.agents_files[{i}]", path, snapshot, run_dir, f"the snapshot {snapshot}")
            if agents.name != "agents.jsonl" or agents.parent.parent != snapshot:
                raise refused(f"source.agents_files[{i}]", path,
                              f"{snapshot}/<participant>/agents.jsonl; it resolves to {agents}")
    given_state = source.controller_state
    if given_state is None or "\x00" in given_state or Path(given_state).resolve() != state:
        raise refused("source.controller_state", given_state, f"{state}, the state saved with that source")
