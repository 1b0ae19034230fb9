"""Recovery: where a restarted run continues from, and why.

The recovery workflow and the chaos checker both read these; they carry paths, counts
and reasons, never rows or tensors.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from turnkeep.schemas.participant import Artifact
from turnkeep.schemas.steps import Runs, Step
from turnkeep.schemas.wire import Wire

TRAINER_CHECKPOINT_SCHEMA_VERSION = 1

SkipProblem = Literal[
    "unreadable_manifest",  # the manifest is missing its end, not JSON, or not a manifest
    "newer_schema",  # written by a newer turnkeep than this one
    "foreign_run",  # written by another run (run id differs)
    "fingerprint_differs",  # written with different model/task/group settings
    "missing_file",  # an artifact named in the manifest is gone, or a required one is not named
    "unlisted_file",  # the directory holds a file its manifest does not list (so it could not be verified)
    "truncated",  # an artifact is shorter (or longer) than the manifest says
    "digest_mismatch",  # an artifact's sha256 differs from the manifest
    "policy_version_mismatch",  # snapshot and trainer checkpoint disagree on the policy version
    "journal_unreadable",  # the journal a snapshot's state names is missing, damaged or not the one it was cut from
]


class SkippedCandidate(Wire):
    path: str
    """The trainer checkpoint or snapshot directory that was not used."""
    problem: SkipProblem
    """Why, as a stable name."""
    detail: str
    """Why, in words, naming the file or setting."""


class SourceKind(StrEnum):
    SNAPSHOT = "snapshot"
    """The newest published snapshot under the newest trainer checkpoint."""
    OLDER_SNAPSHOT = "older_snapshot"
    """A snapshot under the newest usable trainer checkpoint, after newer ones failed to verify."""
    TRAINER_CHECKPOINT = "trainer_checkpoint"
    """The trainer checkpoint's own data plane; running agents continue from the environment servers' turn
    journals (those of a server without one start over)."""
    FRESH = "fresh"
    """No trainer checkpoint existed yet: the run starts from step 0."""


class RecoverySource(Wire):
    kind: SourceKind
    """Which kind of state the run continues from."""
    step: int
    """Trainer step restored (0 for a fresh start)."""
    policy_version: int
    """Policy version restored (0 for a fresh start)."""
    checkpoint_dir: str | None = None
    """Trainer checkpoint directory (`checkpoints/step_N`)."""
    snapshot_dir: str | None = None
    """Snapshot directory (`checkpoints/step_N/snapshots/<n>`); None unless kind is a snapshot."""
    controller_state: str | None = None
    """JSON file with the controller state to load: the snapshot's `controller/state.json`
    or the checkpoint's `controller_state.json`."""
    agents_files: list[str] = []
    """The snapshot's `*/agents.jsonl` files (saved agents to continue)."""
    reason: str
    """Why this source, in words (what was newer and why it was not used)."""
    skipped: list[SkippedCandidate] = []
    """Every newer candidate that failed verification, newest first."""


class TrainerCheckpointManifest(Wire):
    """`checkpoints/step_N/checkpoint.json`, written last inside the staging directory."""

    schema_version: int = TRAINER_CHECKPOINT_SCHEMA_VERSION
    run_id: str
    step: int
    policy_version: int
    config_fingerprint: str
    fingerprint_fields: dict[str, Any]
    """The settings behind the fingerprint, so a refusal can name the one that differs."""
    created_unix_s: float
    artifacts: list[Artifact]
    """Every file of the checkpoint except this manifest, with sha256 and size."""


# ---- the recovery workflow ----


class RecoveryInput(Wire):
    run_id: str
    incarnation: int
    """The new controller's incarnation; the previous one's attempts are cancelled first."""
    phase_timeout_s: float
    """Start-to-close of each recovery activity."""
    engines: list[int] | None = None
    """The policy engines the restored weights are loaded into, in parallel (None: a history from before engines,
    one policy server)."""


class CancelStaleResult(Wire):
    cancelled: list[str]
    """Workflow ids of the previous incarnation that were open and are now closed."""
    terminated: list[str] = []
    """Ones that did not close within the timeout after the cancel and were terminated."""


class RecoveryStepInput(Wire):
    run_id: str
    incarnation: int


class ChooseSourceResult(Wire):
    source: RecoverySource


RECOVERY_CANCEL_STALE = Step("recovery.cancel_stale", RecoveryStepInput, CancelStaleResult, Runs.CONTROLLER)
RECOVERY_CHOOSE_SOURCE = Step("recovery.choose_source", RecoveryStepInput, ChooseSourceResult, Runs.CONTROLLER)


class RestoreInput(Wire):
    run_id: str
    incarnation: int
    source: RecoverySource


class RestoreResult(Wire):
    step: int
    policy_version: int
    data_plane_rows: int
    unfinished_groups: int
    continuations: int
    """Saved agents that will continue from their saved turn (attempt N+1)."""
    restarted_siblings: int
    """Unfinished siblings that start over from scratch."""
    kept_after_cut_records: int = 0
    """Controller journal records after the cut that the restore kept (`rollout_recovery.keep_after_cut`)."""
    undone_steps: list[int] = []
    """Trainer steps after the cut, lost with the trainer: their groups train again first."""


RECOVERY_RESTORE = Step("recovery.restore", RestoreInput, RestoreResult, Runs.CONTROLLER)


class PolicyLoadInput(Wire):
    run_id: str
    incarnation: int
    policy_version: int
    """The version the restored trainer holds; the policy server loads the trainer's weights as this version."""


class PolicyLoadResult(Wire):
    bytes: int
    """Size of the weights loaded."""
    seconds: float
    """Fetching the weights from the trainer (through Ray) and loading them into the engine in place."""


POLICY_LOAD_WEIGHTS = Step("policy.load_weights", PolicyLoadInput, PolicyLoadResult, Runs.POLICY)


class ResumeAfterRestoreResult(Wire):
    admission_closed_s: float
    """Seconds new rollouts were held while the run was restored."""


RECOVERY_RESUME = Step("recovery.resume", RecoveryStepInput, ResumeAfterRestoreResult, Runs.CONTROLLER)


class RecoveryResult(Wire):
    source: RecoverySource | None
    """None only when superseded before it chose one."""
    restore: RestoreResult | None
    cancelled: list[str]
    seconds: dict[str, float]
    """Seconds per recovery phase."""
    superseded: str | None = None
    """Why it stopped early: a newer incarnation of the run took over (nothing went wrong)."""
