"""Every retry policy the workflows use, each named for what it is for.

Error types come from `schemas.names`, so an activity that raises one and a policy that
stops retrying on it cannot drift apart.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from turnkeep.schemas.names import ErrorType

ATTEMPT_FEW_TRIES = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3)
"""Attempt phases whose failure only costs this attempt (preflight, staging, prepare, resume)."""

ATTEMPT_TRANSIENT = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), backoff_coefficient=2.0, maximum_attempts=5,
    non_retryable_error_types=[ErrorType.INVARIANT_BROKEN, ErrorType.TRAINER_MOVED],
)
"""Attempt phases that may meet a transient participant or disk failure (hold, commit, cut, publish)."""

ATTEMPT_PERSISTENT = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=5), maximum_attempts=20,
    non_retryable_error_types=[ErrorType.INVARIANT_BROKEN],
)
"""Compensations and the trainer release: they must get through, or training stays held."""

RUN_QUICK = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5)
"""The run workflow's short controller calls (anchor, checkpoint request, record)."""

RUN_UNTIL_IT_WORKS = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))
"""A release left pending after publish: admission stays closed until it succeeds."""

RECOVERY_FEW_TRIES = RetryPolicy(
    initial_interval=timedelta(milliseconds=500), maximum_attempts=3,
    non_retryable_error_types=[ErrorType.UNUSABLE_RUN_DIR, ErrorType.CRASH_RESTORE_FAILED,
                               ErrorType.STALE_INCARNATION],
)
"""Recovery steps: an unusable run directory or a failed restore is final."""

WORKFLOW_TASK_TIMEOUT = timedelta(seconds=3)
"""How long a workflow task may stay with a worker before another takes it (Temporal's default is 10 s). A
controller killed inside a workflow task (its local activities run inside one) holds that task until it times out,
and the next incarnation's cancel of the dead one's attempt waits on it: 10.2 s of many chaos restarts. The SDK
extends a task whose local activities run longer by heartbeating it, so only a dead worker's task times out."""

STICKY_TASK_FALLBACK = timedelta(seconds=2)
"""How long a workflow task waits on the worker's own (sticky) queue before any worker may take it (the SDK's
default is 10 s). The next incarnation resets stickiness before it cancels, but a task already queued for the dead
worker still waits this out: one cancel of a chaos run took 10.3 s. A live worker that misses it only replays."""
