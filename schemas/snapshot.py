"""Snapshot attempts: the workflows' and activities' inputs and results, and the manifest.

Workflows carry only ids, paths, digests and counts; rows and tensors never enter history.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from turnkeep.schemas.choices import AgentsMode, Outcome, Trigger
from turnkeep.schemas.participant import Artifact
from turnkeep.schemas.wire import Wire

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
    engines: list[int] | None = None
    """The policy engines a parked attempt fences, each on its own queue (`<run_id>.policy.<k>`): prepare, commit,
    resume and abort fan out to all of them. None: the one policy server of a history recorded before engines."""


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
    engines: list[int] | None = None
    """The run's policy engines at start (None: a history from before engines); its attempts fence these."""


MAX_ENGINES = 256
"""The most policy engines a run fences in one attempt (`set_engines` refuses more)."""


class SetEnginesInput(Wire):
    """The run workflow's `set_engines` update: the policy engines the attempts started after it fence."""

    engines: list[int]
    """Engine indices (engine k serves `<run_id>.policy.<k>`): at least one, none twice, none negative, at most
    `MAX_ENGINES`."""


class SetEnginesResult(Wire):
    engines: list[int]
    """The list the next attempts fence."""
    previous: list[int]
    """The list before the update (empty for a run started before engines, whose attempts fence the one policy
    server)."""
    started: list[int] = []
    """Engines started, refitted and taking turns."""
    retired: list[int] = []
    """Engines that finished their calls and stopped."""
    seconds: float = 0.0
    """The controller's time to carry the change out."""


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
