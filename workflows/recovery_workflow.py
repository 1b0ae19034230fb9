"""The recovery workflow: one per restart of a run (`<run_id>.recovery.<incarnation>`).

cancel what the previous incarnation left open -> choose the source (newest verified
snapshot, an older one, or the trainer checkpoint's own data plane) -> restore while
paused -> load the restored weights into every policy engine at once (each its own activity,
in its process) -> resume. Its summary and details say which source was used and why, so the
Temporal UI answers "where did this run continue from?".
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from turnkeep.workflows.engine_fanout import fan_out
from turnkeep.workflows.retry_policies import RECOVERY_FEW_TRIES
from turnkeep.workflows.timed_activity import timed_activity

with workflow.unsafe.imports_passed_through():
    from turnkeep.schemas import search_attributes as sa
    from turnkeep.schemas.names import ErrorType, WorkflowType
    from turnkeep.schemas.recovery import (
        POLICY_LOAD_WEIGHTS,
        RECOVERY_CANCEL_STALE,
        RECOVERY_CHOOSE_SOURCE,
        RECOVERY_RESTORE,
        RECOVERY_RESUME,
        PolicyLoadInput,
        RecoveryInput,
        RecoveryResult,
        RecoveryStepInput,
        RestoreInput,
        SourceKind,
    )
    from turnkeep.schemas.steps import Step


OUTCOME_IN_LIST = "recovery-outcome-in-list"
"""Patch id: the source as a search attribute, and a superseded recovery completes (it failed before)."""


def _superseded_by(err: BaseException) -> str | None:
    root = err
    while root.__cause__ is not None:
        root = root.__cause__
    if isinstance(root, ApplicationError) and root.type == ErrorType.STALE_INCARNATION:
        return root.message
    return None


@workflow.defn(name=WorkflowType.RECOVERY)
class RecoveryWorkflow:
    def __init__(self) -> None:
        self._phase = "starting"

    @workflow.query
    def phase(self) -> str:
        return self._phase

    @workflow.run
    async def run(self, inp: RecoveryInput) -> RecoveryResult:
        seconds: dict[str, float] = {}
        try:
            return await self._recover(inp, seconds)
        except ActivityError as err:
            superseded = _superseded_by(err)
            if superseded is None or not workflow.patched(OUTCOME_IN_LIST):
                raise
            # A newer incarnation took the run over: nothing went wrong, and the UI should not say Failed.
            workflow.upsert_search_attributes([sa.RESTORE_SOURCE.value_set("superseded")])
            workflow.set_current_details(f"superseded: {superseded}")
            return RecoveryResult(source=None, restore=None, cancelled=[], seconds=seconds, superseded=superseded)

    async def _recover(self, inp: RecoveryInput, seconds: dict[str, float]) -> RecoveryResult:
        step = RecoveryStepInput(run_id=inp.run_id, incarnation=inp.incarnation)
        cancelled = await self._call("cancel_stale", RECOVERY_CANCEL_STALE, step, inp, seconds,
                                     heartbeat_s=30)
        chosen = await self._call("choose_source", RECOVERY_CHOOSE_SOURCE, step, inp, seconds)
        source = chosen.source
        if workflow.patched(OUTCOME_IN_LIST):
            workflow.upsert_search_attributes([sa.RESTORE_SOURCE.value_set(str(source.kind))])
        workflow.set_current_details(f"restoring from {source.kind} (step {source.step}): {source.reason}")
        restored = await self._call("restore", RECOVERY_RESTORE,
                                    RestoreInput(run_id=inp.run_id, incarnation=inp.incarnation, source=source),
                                    inp, seconds)
        # A fresh start's engines hold the model's own weights, unless the restore kept a trainer's steps.
        if source.kind is not SourceKind.FRESH or restored.policy_version > 0:
            load = PolicyLoadInput(run_id=inp.run_id, incarnation=inp.incarnation,
                                   policy_version=restored.policy_version)
            await fan_out(seconds, "load_weights", inp.engines, lambda clock, engine: self._call(
                "load_weights", POLICY_LOAD_WEIGHTS, load, inp, clock, heartbeat_s=30, engine=engine))
        await self._call("resume", RECOVERY_RESUME, step, inp, seconds)
        workflow.set_current_details(
            f"restored from {source.kind} (step {source.step}, policy version {restored.policy_version}): "
            f"{restored.data_plane_rows} rows, {restored.continuations} agents continue from their saved turn, "
            f"{restored.restarted_siblings} siblings start over; kept {restored.kept_after_cut_records} journal "
            f"records after the cut, {len(restored.undone_steps)} undone trainer steps train again first. "
            f"{source.reason}"
        )
        return RecoveryResult(source=source, restore=restored, cancelled=cancelled.cancelled + cancelled.terminated,
                              seconds=seconds)

    async def _call(self, phase: str, step: Step, arg, inp: RecoveryInput, seconds: dict[str, float], *,
                    heartbeat_s: float | None = None, engine: int | None = None):
        self._phase = phase
        return await timed_activity(seconds, phase, step, arg, inp.phase_timeout_s, RECOVERY_FEW_TRIES,
                                    run_id=inp.run_id, heartbeat_s=heartbeat_s, engine=engine)
