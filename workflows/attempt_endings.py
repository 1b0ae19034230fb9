"""How a snapshot attempt ends early: what the ending is called (outcome and reason), its cleanup that no cancel
cuts short, and the hand-over of a cancelled attempt's result to the run workflow."""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from turnkeep.schemas.choices import Outcome
    from turnkeep.schemas.names import ATTEMPT_CANCELLED_SIGNAL, ErrorType
    from turnkeep.schemas.snapshot import SnapshotAttemptResult


async def uncancellable(work) -> bool:
    """Run `work` to its end whatever cancels arrive meanwhile; True when one did. Compensation and the handover
    are the attempt's cleanup: a cancel (a newer incarnation superseding this one, an operator's second cancel)
    must not cut them short."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await workflow.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    task.result()
    return cancelled


async def hand_to_parent(result: SnapshotAttemptResult) -> None:
    """The run workflow records the attempt (metrics, audit); a Canceled workflow has no result, so it is signalled.
    Awaited, so the signal is in the parent's history before the cancellation is."""
    parent = workflow.info().parent
    if parent is None:
        return
    try:
        await workflow.get_external_workflow_handle(parent.workflow_id, run_id=parent.run_id).signal(
            ATTEMPT_CANCELLED_SIGNAL, result)
    except Exception as err:  # the parent is gone (the run itself was cancelled): nobody to tell
        workflow.logger.info("could not hand %s to the run workflow: %s", result.checkpoint_id, err)


def cause(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    return str(err) or err.__class__.__name__


def classify(err: BaseException) -> tuple[Outcome, str, bool]:
    """(outcome, reason, invariant broken) for what ended the attempt early."""
    if is_cancelled_exception(err):
        return Outcome.ABORTED, "cancelled (temporal workflow cancel, or the run is stopping)", False
    root = err
    while root.__cause__ is not None:
        root = root.__cause__
    if isinstance(root, ApplicationError) and root.type == ErrorType.STALE_INCARNATION:
        return Outcome.ABORTED, f"superseded: {root.message}", False
    if isinstance(root, ApplicationError) and root.type == ErrorType.INVARIANT_BROKEN:
        return Outcome.FAILED, f"invariant broken: {root.message}", True
    if isinstance(root, ApplicationError) and root.type == ErrorType.TRAINER_MOVED:
        return Outcome.SKIPPED, root.message, False
    return Outcome.FAILED, cause(err), False
