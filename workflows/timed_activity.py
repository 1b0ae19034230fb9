"""One activity call from a workflow, with its seconds added to the caller's per-phase clock.

Shared by the attempt and recovery workflows, so both report phases the same way.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from turnkeep.schemas.steps import Step


async def timed_activity(seconds: dict[str, float], phase: str, step: Step, arg, timeout_s: float, retry: RetryPolicy,
                         *, run_id: str, heartbeat_s: float | None = None, total_s: float | None = None,
                         local: bool = False, engine: int | None = None):
    """`step` of run `run_id` (its result type and task queue follow from it). `timeout_s` bounds one try; `total_s`,
    when given, every try together (schedule-to-close). `local` runs it as a local activity on the workflow's own
    worker (no task queue, no heartbeat). `engine`: the policy engine a policy step runs on."""
    activity, result_type, task_queue = step, step.result, step.task_queue(run_id, engine)
    began = workflow.time()
    try:
        if local:
            result = await workflow.execute_local_activity(
                activity, arg, result_type=result_type, start_to_close_timeout=timedelta(seconds=timeout_s),
                retry_policy=retry, summary=str(activity),
                schedule_to_close_timeout=timedelta(seconds=total_s) if total_s is not None else None,
            )
        else:
            result = await workflow.execute_activity(
                activity, arg, result_type=result_type, task_queue=task_queue,
                start_to_close_timeout=timedelta(seconds=timeout_s), retry_policy=retry,
                schedule_to_close_timeout=timedelta(seconds=total_s) if total_s is not None else None,
                heartbeat_timeout=timedelta(seconds=heartbeat_s) if heartbeat_s else None,
                summary=str(activity),
            )
    except (Exception, asyncio.CancelledError):
        tick(seconds, phase, began)
        raise
    tick(seconds, phase, began)
    return result


def tick(seconds: dict[str, float], phase: str, began: float) -> None:
    """Add the time since `began` to `phase`. Called on the outcomes the workflow sees, never from a `finally`: a
    workflow instance dropped from the worker's cache is closed with GeneratorExit outside its event loop, where
    `workflow.time()` raises (and the interpreter prints that as a traceback in the run's log)."""
    seconds[phase] = round(seconds.get(phase, 0.0) + workflow.time() - began, 3)
