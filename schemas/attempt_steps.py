"""The steps of a snapshot attempt and of the run workflow: each one's models, then its `Step` (its activity's
name, the models, where it runs). See `schemas/steps.py`."""

from __future__ import annotations

from turnkeep.schemas.choices import Trigger
from turnkeep.schemas.participant import Artifact, JournalMark
from turnkeep.schemas.snapshot import SnapshotAttemptResult
from turnkeep.schemas.steps import Runs, Step
from turnkeep.schemas.wire import Wire


class PreflightInput(Wire):
    run_id: str
    checkpoint_id: str
    incarnation: int
    anchor_step: int
    """The step the run workflow expects; preflight skips when the trainer is elsewhere."""


class PreflightResult(Wire):
    skip_reason: str | None
    """Set when the attempt should end as skipped (with this reason)."""


PREFLIGHT = Step("snapshot.preflight", PreflightInput, PreflightResult, Runs.LOCAL)


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


ANCHOR = Step("snapshot.anchor", AnchorQuery, AnchorResult, Runs.LOCAL)
REQUEST_CHECKPOINT = Step("snapshot.request_checkpoint", CheckpointRequest, CheckpointRequestResult, Runs.LOCAL)


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


TRAINER_HOLD = Step("trainer.hold", TrainerHoldInput, TrainerHoldResult, Runs.TRAINER)
TRAINER_RELEASE = Step("trainer.release", TrainerReleaseInput, TrainerReleaseResult, Runs.TRAINER)


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


GYM_MARK = Step("gym.mark", GymInput, GymMarkResult, Runs.LOCAL)
GYM_PREPARE = Step("gym.prepare", GymInput, GymPrepareResult, Runs.CONTROLLER)
GYM_COMMIT = Step("gym.commit", GymInput, GymCommitResult, Runs.CONTROLLER)
GYM_RESUME = Step("gym.resume", GymInput, GymReleaseResult, Runs.CONTROLLER)
GYM_ABORT = Step("gym.abort", GymInput, GymReleaseResult, Runs.CONTROLLER)
POLICY_PREPARE = Step("policy.prepare", GymInput, PolicyPrepareResult, Runs.POLICY)
POLICY_COMMIT = Step("policy.commit", GymInput, GymCommitResult, Runs.POLICY)
POLICY_RESUME = Step("policy.resume", GymInput, GymReleaseResult, Runs.POLICY)
POLICY_ABORT = Step("policy.abort", GymInput, GymReleaseResult, Runs.POLICY)


class StagingInput(Wire):
    run_id: str
    checkpoint_id: str
    incarnation: int
    anchor_step: int
    number: int


class StagingResult(Wire):
    staging_dir: str


OPEN_STAGING = Step("snapshot.open_staging", StagingInput, StagingResult, Runs.LOCAL)


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


CUT = Step("data_plane.cut", CutInput, CutResult, Runs.LOCAL)


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


PUBLISH = Step("snapshot.publish", PublishInput, PublishResult, Runs.LOCAL)


class DiscardStagingInput(Wire):
    checkpoint_id: str
    incarnation: int
    staging_dir: str | None


DISCARD_STAGING = Step("snapshot.discard_staging", DiscardStagingInput, type(None), Runs.LOCAL)


class AttemptRecord(Wire):
    """Written to metrics.jsonl as a `"kind": "snapshot"` line."""

    result: SnapshotAttemptResult
    consecutive_failures: int


class RecordResult(Wire):
    warning: str | None = None
    """Set when the attempt kept admission closed longer than the attempt interval."""


RECORD = Step("snapshot.record", AttemptRecord, RecordResult, Runs.LOCAL)
