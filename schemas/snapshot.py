"""Snapshot attempts: the workflows' and activities' inputs and results, and the manifest.

Workflows carry only ids, paths, digests and counts; rows and tensors never enter history.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.choices import AgentsMode, Outcome, Trigger
from schemas.participant import Artifact, JournalMark
from schemas.wire import Wire

MANIFEST_SCHEMA_VERSION = 1


class SnapshotTimeouts(Wire):
    prepare_s: float
    """Start-to-close of gym.prepare (participants park and drain)."""
    phase_s: float
    """Start-to-close of every other phase."""
    lease_s: float
    """Lease of every hold the attempt takes."""


# ---- the attempt workflow ----


class SnapshotAttemptInput(Wire):
    run_id: str
    """Training run."""
    checkpoint_id: str
    """Stable across retries of this attempt: `<run_id>.snapshot.<anchor_step>.<n>`."""
    number: int
    """n: the attempt's number under its anchor step; the published folder's name."""
    trigger: Trigger
    """Why the attempt was started."""
    anchor_step: int
    """Trainer checkpoint step the snapshot is filed under."""
    incarnation: int
    """Controller incarnation; activities refuse a stale one."""
    trainer_hold: bool = True
    """Hold the optimizer step across the Gym phase (off only to measure the peer's behaviour)."""
    keep_latest_k: int = 2
    """Published snapshots kept per trainer checkpoint."""
    checkpoint_hold: str | None = None
    """The train pump's hold on the next optimizer step, which this attempt takes over (tied attempts)."""
    agents: Literal[AgentsMode.PARKED, AgentsMode.JOURNAL] = AgentsMode.PARKED
    """`parked`: close admission and park every agent (gym.prepare, gym.commit, resume). `journal`: stop
    nothing; mark the environment servers' turn journals (gym.mark) and cut."""
    timeouts: SnapshotTimeouts
    """Per-phase limits."""


class SnapshotAttemptResult(Wire):
    checkpoint_id: str
    """The attempt."""
    outcome: Outcome
    """How it ended."""
    reason: str
    """Why (always set, also for published)."""
    anchor_step: int
    """Step the snapshot is filed under."""
    trigger: Trigger
    """Why it started."""
    phase_s: dict[str, float] = {}
    """Seconds per phase (preflight, trainer_hold, gym_prepare, gym_commit, cut, publish, resume, compensate)."""
    admission_closed_s: float = 0.0
    """Seconds new rollouts were held at the admission gate."""
    participant_s: float = 0.0
    """Seconds spent inside participant calls (prepare + commit + resume)."""
    trainer_wait_s: float = 0.0
    """Seconds the optimizer step waited on this attempt's hold."""
    agents_parked_s: float = 0.0
    """Seconds until every agent was parked at a boundary (the lower bound's turn part)."""
    bytes_written: int = 0
    """Bytes of the published snapshot."""
    snapshot_dir: str | None = None
    """Published directory (None unless published)."""
    parked_agents: int = 0
    """Agents saved at a turn boundary."""
    journaled_agents: int = 0
    """Agents running at the cut of a journal snapshot (a restore continues them from the turn journals)."""
    data_plane_rows: int = 0
    """Finished rows in the cut."""
    wall_s: float = 0.0
    """Attempt wall time as the workflow saw it."""
    invariant_broken: bool = False
    """True when the attempt failed on a broken invariant: the run stops."""


# ---- activities ----


class PreflightInput(Wire):
    run_id: str
    checkpoint_id: str
    incarnation: int
    anchor_step: int
    """The step the run workflow expects; preflight skips when the trainer is elsewhere."""


class PreflightResult(Wire):
    skip_reason: str | None
    """Set when the attempt should end as skipped (with this reason)."""


class AnchorQuery(Wire):
    incarnation: int


class CheckpointRequest(Wire):
    incarnation: int
    trigger: Trigger
    """The attempt's trigger; the tied attempt runs with it."""


class CheckpointRequestResult(Wire):
    """Nothing to report: the train pump writes the checkpoint between two steps and announces it
    with the `trainer_checkpoint_saved` signal, which starts the attempt."""


class AnchorResult(Wire):
    current_step: int
    """Step the train pump has committed."""
    newest_checkpoint_step: int | None
    """Step of the newest trainer checkpoint the train pump wrote or restored from (None before the first)."""


class TrainerHoldInput(Wire):
    holder: str
    """`snapshot:<checkpoint_id>`."""
    lease_s: float
    """The hold expires unless renewed or released within this many seconds."""
    release_also: list[str] = []
    """Holders this hold replaces (the train pump's `checkpoint:<step>` hold)."""
    incarnation: int | None = None
    """Controller incarnation of the attempt; the trainer refuses a stale one."""


class TrainerHoldResult(Wire):
    step: int
    """The trainer's last committed train step when the hold was taken."""
    policy_version: int
    """Trainer policy version when the hold was taken."""


class TrainerReleaseInput(Wire):
    holders: list[str]
    """Holders to release (idempotent: an absent one is fine)."""


class TrainerReleaseResult(Wire):
    released: bool
    """False when the holder was already gone (idempotent)."""
    waited_s: float
    """Seconds the optimizer step waited on this holder."""


class GymInput(Wire):
    run_id: str
    checkpoint_id: str
    incarnation: int
    lease_s: float
    staging_dir: str | None = None
    """Attempt's staging directory (commit writes into it)."""


class GymMarkResult(Wire):
    participant_s: float
    """Seconds the environment servers took to make their turn journals durable and say where they stand."""
    marks: list[JournalMark]
    """One per environment server."""


class GymPrepareResult(Wire):
    participant_s: float
    """Seconds the participants took to become ready."""
    agents_parked_s: float = 0.0
    """Seconds from closing admission until every environment server had all its agents parked
    (the time the slowest in-flight turn still needed to reach its boundary)."""


class PolicyPrepareResult(Wire):
    participant_s: float
    """Seconds until the policy server was fenced and drained."""
    drained: int = 0
    """Accepted completion calls that were still running when the fence went up."""


class GymCommitResult(Wire):
    participant_s: float
    artifacts: list[Artifact]
    counts: dict[str, int]


class GymReleaseResult(Wire):
    participant_s: float
    admission_closed_s: float
    """Seconds admission was closed by this attempt (0 when it was never closed or already reopened)."""


class StagingInput(Wire):
    run_id: str
    checkpoint_id: str
    incarnation: int
    anchor_step: int
    number: int


class StagingResult(Wire):
    staging_dir: str


class CutInput(Wire):
    run_id: str
    checkpoint_id: str
    incarnation: int
    staging_dir: str
    anchor_step: int
    """The step the attempt is filed under; without a trainer hold the cut checks it is still current."""
    hold: TrainerHoldResult | None
    """What `trainer.hold` returned, which the cut must still see; None when the attempt runs without the
    trainer hold (`snapshot.trainer_hold = false`)."""
    marks: list[JournalMark] | None = None
    """A journal snapshot: the turn journal positions gym.mark returned (no agents were parked or saved).
    None: the agents were parked and saved by gym.commit."""
    checkpoint_hold: bool = False
    """A journal attempt that holds the trainer by the train pump's `checkpoint:<anchor_step>` hold (`hold` is
    None): a step past the anchor means that hold was gone before the cut, and the cut releases it once taken."""


class CutResult(Wire):
    artifacts: list[Artifact]
    data_plane_rows: int
    unfinished_groups: int
    continuations: int
    running_agents: int = 0
    """Siblings running at the cut (a journal snapshot continues them from the turn journals)."""
    policy_version: int
    """Policy version of the step the cut holds (the manifest records it)."""
    checkpoint_hold_released: bool = False
    """The cut released the train pump's checkpoint hold it kept (through Ray, as the pump took it); False when it
    kept none, or the trainer did not answer (the workflow then releases it on the trainer's queue)."""
    trainer_wait_s: float = 0.0
    """Seconds the optimizer step waited on that hold."""


class PublishInput(Wire):
    run_id: str
    checkpoint_id: str
    incarnation: int
    staging_dir: str
    anchor_step: int
    number: int
    policy_version: int
    artifacts: list[Artifact]
    counts: dict[str, int]
    keep_latest_k: int


class PublishResult(Wire):
    snapshot_dir: str
    bytes_written: int
    pruned: list[str] = []


class DiscardStagingInput(Wire):
    checkpoint_id: str
    incarnation: int
    staging_dir: str | None


class AttemptRecord(Wire):
    """Written to metrics.jsonl as a `"kind": "snapshot"` line."""

    result: SnapshotAttemptResult
    consecutive_failures: int


class RecordResult(Wire):
    warning: str | None = None
    """Set when the attempt kept admission closed longer than the attempt interval."""


# ---- the run workflow ----


class RunWorkflowInput(Wire):
    run_id: str
    incarnation: int
    attempt_interval_s: float | None
    """None: attempts at trainer checkpoints and on request only, no periodic timer."""
    max_consecutive_failures: int
    keep_latest_k: int
    trainer_hold: bool = True
    checkpoint_on_demand: bool = True
    """Periodic and operator attempts ask the train pump for a checkpoint at the current step."""
    agents: Literal[AgentsMode.PARKED, AgentsMode.JOURNAL] = AgentsMode.PARKED
    """`snapshot.agents`: how every attempt keeps the running agents."""
    timeouts: SnapshotTimeouts
    carried: "RunCarryOver | None" = None
    """State carried across continue-as-new."""


class RunCarryOver(Wire):
    numbers: dict[str, int] = {}
    """Next attempt number per anchor step (string keys for JSON)."""
    consecutive_failures: int = 0
    paused: bool = False
    release_pending: str | None = None
    """Checkpoint id whose post-publish release still has to succeed."""
    counts: dict[str, int] = {}
    """Attempts by outcome so far."""
    last_published: str | None = None


class TrainerCheckpointSignal(Wire):
    step: int
    """Step of the trainer checkpoint just published."""
    trigger: Trigger = Trigger.TRAINER_CHECKPOINT
    """What the checkpoint was written for (`save_period`, or an attempt that asked for one)."""
    repeat: bool = False
    """Announced before: a request that raced this checkpoint asks again. No trainer hold was taken for it."""


class SnapshotNowSignal(Wire):
    reason: str = "operator"
    """Free text shown in the attempt's summary."""
    preemption: bool = False
    """True when sent by the SIGTERM handler (trigger `preemption`)."""


class RunStatus(Wire):
    run_id: str
    paused: bool
    consecutive_failures: int
    attempts_by_outcome: dict[str, int]
    running_attempt: str | None
    last_result: SnapshotAttemptResult | None
    release_pending: str | None


class RunWorkflowResult(Wire):
    stopped_reason: str
    attempts_by_outcome: dict[str, int] = Field(default_factory=dict)


RunWorkflowInput.model_rebuild()


class SnapshotManifest(Wire):
    """Written last into a snapshot directory: its presence marks the snapshot complete."""

    schema_version: int = MANIFEST_SCHEMA_VERSION
    """Manifest format; a newer one than the reader knows is refused."""
    run_id: str
    """Run that wrote the snapshot."""
    checkpoint_id: str
    """Attempt that wrote it."""
    anchor_step: int
    """Trainer checkpoint step it is filed under."""
    number: int
    """Attempt number under that step."""
    policy_version: int
    """Trainer policy version at the cut (-1 when the trainer hold was off)."""
    config_fingerprint: str
    """Digest of the settings a restore depends on."""
    created_unix_s: float
    """Wall-clock time of publication."""
    artifacts: list[Artifact]
    """Every file with its sha256 and size, paths relative to the snapshot directory."""
    counts: dict[str, int]
    """Parked agents, data-plane rows, unfinished groups, continuations."""
