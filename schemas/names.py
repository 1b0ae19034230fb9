"""Every name that more than one process or module must spell the same way.

Task queues, workflow types and ids, hold-set holders and the error types the workflows
match on (activity names are the workflows' steps, `schemas/steps.py`). Workflows import only `schemas/`, so these live here and
the workflows, the activities and the workers all read them from this one module: a
rename cannot leave a stale copy behind, and a recorded history still names the same
activities.
"""

from __future__ import annotations

from enum import StrEnum

# -- task queues: one per process that runs a Temporal worker --------------------------


def ray_namespace(run_id: str) -> str:
    """The run's Ray namespace: its actors' names are looked up in it after a controller crash."""
    return f"turnkeep-{run_id}"


def controller_queue(run_id: str) -> str:
    """The workflows and the controller's activities."""
    return f"{run_id}.controller"


def trainer_queue(run_id: str) -> str:
    """Activities that change the trainer's own state (its hold), in the trainer process."""
    return f"{run_id}.trainer"


def policy_queue(run_id: str, engine: int | None = None) -> str:
    """Activities that change one policy engine's own state (its gate, its weights), in its process:
    `<run_id>.policy.<k>` for engine k; None names the single policy server's queue of histories recorded before
    a run had several engines."""
    return f"{run_id}.policy" if engine is None else f"{run_id}.policy.{engine}"


def engine_name(engine: int) -> str:
    """Engine k's Ray actor name and participant name (its folder in a snapshot)."""
    return f"policy.{engine}"


def shard_keeper_name(rank: int) -> str:
    """The Ray actor name of the process beside trainer rank `rank` that holds its shard's copies
    (`gpu_workers.shard_keeper`)."""
    return f"shard_keeper.{rank}"


# -- workflows ---------------------------------------------------------------------------


class WorkflowType(StrEnum):
    RUN = "TurnkeepRun"
    SNAPSHOT_ATTEMPT = "SnapshotAttempt"
    RECOVERY = "TurnkeepRecovery"


ATTEMPT_CANCELLED_SIGNAL = "attempt_cancelled"
"""A cancelled attempt hands the run workflow its result this way: a Canceled workflow returns none."""


def run_workflow_id(run_id: str) -> str:
    return f"{run_id}.run"


def checkpoint_id(run_id: str, anchor_step: int, number: int) -> str:
    """An attempt's id: its workflow id, its holder name and its participants' fencing token."""
    return f"{run_id}.snapshot.{anchor_step}.{number}"


def recovery_workflow_id(run_id: str, incarnation: int) -> str:
    return f"{run_id}.recovery.{incarnation}"


# -- holders of the hold sets (admission, deadlines, the trainer hold, the policy gate) --

REFIT_HOLDER = "refit"
"""Admission (controller and policy server) while new weights load."""

ENGINES_REFIT_HOLDER = "refit:all-engines"
"""Every engine's gate while a refit loads into several engines: none reopens before all have the new version."""

REPLAY_HOLDER = "replay"
"""Admission while a restored trainer trains its undone steps again and a turn generated now, with the policy of
the moment, could not be trained within `train.max_staleness` behind them and the groups already open: its whole
group (turns kept from before the kill included) would be discarded."""

CHECKPOINT_HOLDER_PREFIX = "checkpoint:"

PREEMPTION_HOLDER = "preemption"
"""The trainer hold while a preemption checkpoints the last finished step under a step still computing: the running
step never reaches its optimizer step, so its groups stay untrained in the checkpoint and train after the restart."""


def snapshot_holder(checkpoint_id: str) -> str:
    """An attempt's holder in every hold set it closes."""
    return f"snapshot:{checkpoint_id}"


def checkpoint_holder(step: int) -> str:
    """The train pump's trainer hold after a checkpoint, until that checkpoint's attempt takes it over."""
    return f"{CHECKPOINT_HOLDER_PREFIX}{step}"


def recovery_holder(incarnation: int) -> str:
    """Admission and the policy gate while a restarted run restores."""
    return f"recovery:{incarnation}"


# -- error types the workflows match on ----------------------------------------------


class ErrorType(StrEnum):
    INVARIANT_BROKEN = "InvariantBroken"
    """A bug: fails the attempt and stops the run."""
    PARTICIPANT_REFUSED = "ParticipantRefused"
    PARTICIPANT_UNAVAILABLE = "ParticipantUnavailable"
    """Transient (connection refused, 5xx, timeout): retried within the attempt's budget."""
    INVALID_INPUT = "InvalidInput"
    """An activity input refused before anything moved (not retried: the same input is refused again)."""
    STALE_INCARNATION = "StaleIncarnation"
    """An activity of a dead controller incarnation; benign."""
    TRAINER_MOVED = "TrainerMoved"
    """A train step finished during the Gym phase without a trainer hold: the attempt is skipped."""
    UNUSABLE_RUN_DIR = "UnusableRunDir"
    CRASH_RESTORE_FAILED = "CrashRestoreError"
