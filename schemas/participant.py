"""The checkpoint participant protocol, spoken over HTTP by the environment server and
the policy server, and driven by the controller's `gym.*` activities.

Every call carries the checkpoint id; a reply for another id is an invariant break.
`abort` and `resume` are idempotent. A prepared participant holds a lease and resumes
by itself when the coordinator stops renewing it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from turnkeep.schemas.environments import EnvironmentCapabilities
from turnkeep.schemas.rollout import RolloutRequest, Segment, TurnBoundary
from turnkeep.schemas.wire import Wire

PROTOCOL_VERSION = 1

MAX_LEASE_S = 3600.0
"""The longest lease a participant grants: a coordinator that vanished releases it within the hour at worst."""

CheckpointId = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")]
"""`<run_id>.snapshot.<step>.<number>` in practice; the pattern keeps ids printable and path-free."""

CheckpointRoute = Literal["capabilities", "prepare", "status", "renew", "commit", "resume", "abort", "restore", "mark"]
"""The `/checkpoint/<route>` names (fault injection addresses routes by these)."""


class ParticipantState(StrEnum):
    RUNNING = "running"
    PREPARING = "preparing"
    PREPARED = "prepared"
    COMMITTED = "committed"


class Capabilities(Wire):
    name: str
    """Participant name; also its folder inside a snapshot (`env`, `policy`)."""
    kind: str
    """`environment` or `policy`."""
    protocol_version: int = PROTOCOL_VERSION
    """Version of this protocol the participant speaks."""
    saves_state: bool
    """True when commit writes artifacts (agents, resources); False for a fence-only participant."""
    environments: list[EnvironmentCapabilities] = []
    """An environment server: what each environment it runs can do for recovery (empty: it runs no agents)."""
    journals_turns: bool = False
    """An environment server that journals every committed turn boundary, so a snapshot can keep its running agents
    as journal positions (`snapshot.agents = "journal"`) instead of parking them."""


class PrepareRequest(Wire):
    checkpoint_id: CheckpointId
    """Attempt's checkpoint id (stable across retries of the same attempt)."""
    lease_s: float = Field(gt=0, le=MAX_LEASE_S)
    """The participant resumes by itself unless renewed within this many seconds."""


class LeaseRequest(Wire):
    checkpoint_id: CheckpointId
    """Checkpoint whose lease is renewed."""
    lease_s: float = Field(gt=0, le=MAX_LEASE_S)
    """New lease from now."""


class CheckpointRef(Wire):
    checkpoint_id: CheckpointId
    """Checkpoint the call is about (resume, abort)."""


class CommitRequest(Wire):
    checkpoint_id: CheckpointId
    """Checkpoint being committed; must be the prepared one."""
    directory: str | None = None
    """Absolute staging directory the participant writes its artifacts into (a participant on the same machine)."""
    inline: bool = False
    """Answer with the artifacts' contents instead (`CommitResult.files`): a participant on another machine."""

    @model_validator(mode="after")
    def _one_destination(self) -> "CommitRequest":
        if (self.directory is None) == (not self.inline):
            raise ValueError("give either directory (write there) or inline = true (send the files back), not both")
        return self


class Artifact(Wire):
    path: str
    """Path relative to the snapshot directory."""
    sha256: str
    """Hex digest of the file."""
    bytes: int
    """File size."""


class ParticipantStatus(Wire):
    name: str
    """Participant that answers."""
    checkpoint_id: str | None
    """Checkpoint the participant is prepared for (None while running normally)."""
    state: ParticipantState
    """Where the participant is in the protocol."""
    ready: bool
    """Prepared and quiescent: nothing runs, nothing is parked without a boundary, nothing unACKed."""
    running: int = 0
    """Work still moving (agents mid-turn, accepted policy calls)."""
    parked: int = 0
    """Agents parked at a turn boundary."""
    waiting: int = 0
    """Requests held at the participant's door that have not started (they hold no state)."""
    unacked: int = 0
    """Finished results whose receipt the controller has not ACKed."""
    lease_remaining_s: float | None = None
    """Seconds until the participant resumes by itself."""
    detail: str = ""
    """Human-readable note (why not ready)."""


class CommitResult(Wire):
    name: str
    """Participant that wrote the artifacts."""
    checkpoint_id: str
    """Checkpoint the artifacts belong to."""
    artifacts: list[Artifact]
    """Every file written, with digest and size."""
    counts: dict[str, int] = {}
    """What was saved (for example parked agents)."""
    files: dict[str, str] = {}
    """Inline commits only: file name -> base64 contents, for the coordinator to write into the snapshot."""


class ControlReply(Wire):
    name: str
    """Participant that answers."""
    checkpoint_id: str
    """Echo of the request's checkpoint id."""
    state: ParticipantState
    """State after the call."""
    changed: bool
    """False when the call was a repeat (idempotent no-op)."""


class ParticipantError(Wire):
    error: str
    """What went wrong and how to fix it."""
    code: str
    """Stable machine-readable code: `bad_request`, `unauthorized`, `wrong_checkpoint`, `not_prepared`,
    `released` (the checkpoint already ended: resumed, aborted or its lease ran out), `too_large`,
    `io_error`, `injected_fault`."""
    checkpoint_id: str | None = None
    """Echo of the request's checkpoint id (None when the request carried none or did not parse)."""


class SavedAgent(Wire):
    """One agent parked at a turn boundary, as a snapshot keeps it (a line of `agents.jsonl`)."""

    request: RolloutRequest
    """The rollout request the agent was started with."""
    boundary: TurnBoundary
    """Its newest committed turn boundary: the conversation so far, as token ids."""
    env_state: dict[str, Any] | None
    """The environment's own exported state at that boundary (`Environment.export_state()`); None for a
    stateless environment (replayed from the saved turns) and a restart_only one (it cannot continue)."""
    partial: Segment | None = None
    """The tokens of the next turn that the turn journal kept before a crash cut it (the `token` level): the
    continuation generates the rest of that turn after them. None: the next turn starts afresh."""

    @model_validator(mode="after")
    def _same_rollout(self) -> "SavedAgent":
        if self.boundary.rollout_id != self.request.rollout_id:
            raise ValueError(
                f"boundary belongs to rollout {self.boundary.rollout_id!r}, request is {self.request.rollout_id!r}"
            )
        return self


class JournalMark(Wire):
    """Reply of `POST /checkpoint/mark`: where an environment server's turn journal stands, durable up to here.

    A snapshot that keeps its agents in the journals records one per server instead of saving agents."""

    name: str
    checkpoint_id: CheckpointId
    log_id: str
    """The journal's identity (`env/<server name>`)."""
    seq: int = Field(ge=0)
    """Boundaries journaled so far: every one up to here is on disk."""
    chain: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The journal's chain digest after them."""


class RunningAgent(Wire):
    """A rollout a restored controller still has running, as a restore from a turn journal asks for it."""

    max_version: int = Field(ge=0)
    """The newest policy version the restored trainer knows: no turn of a newer one is continued."""
    incarnation: int = Field(ge=0)
    """The controller incarnation that started this attempt: a same-named attempt journaled by another
    incarnation belongs to a lineage the restore rolled back, and is not continued."""


class RestoreRequest(Wire):
    """Body of `POST /checkpoint/restore`: load this participant's part of a snapshot, paused."""

    checkpoint_id: CheckpointId
    """The recovery that asks (`<run_id>.recovery.<incarnation>`)."""
    directory: str | None = None
    """This participant's folder inside the chosen snapshot (for example `<snapshot>/env`)."""
    files: dict[str, str] = {}
    """Instead of a directory: that folder's files, name -> base64 contents (a participant on another machine)."""
    journal: dict[str, RunningAgent] = {}
    """Instead of a snapshot: the rollouts (attempt N) the restored controller still has running; the participant
    continues each from the newest boundary in its own turn journal that the same incarnation journaled and whose
    turns all come from policy versions the restore kept."""

    @model_validator(mode="after")
    def _one_source(self) -> "RestoreRequest":
        if sum([self.directory is not None, bool(self.files), bool(self.journal)]) != 1:
            raise ValueError("give exactly one of directory, files and journal")
        return self


class HeldBoundary(Wire):
    """A rollout a participant holds after a restore, ready to continue: where it stands."""

    rollout_id: str
    turn_index: int
    """Turns completed at the boundary it continues from."""
    segments: int
    """Segments of the conversation up to that boundary."""
    boundary_sha: str
    """`segments_digest` of those segments."""
    done: bool = False
    """The episode ended there: continuing only scores it."""
    partial_tokens: int = 0
    """Tokens of the next turn it continues from (journaled before a crash cut that turn; the `token` level)."""


class RestoreReply(Wire):
    name: str
    """Participant that answers."""
    checkpoint_id: str
    """Echo of the request's id."""
    restored: list[str]
    """Rollout ids of the saved agents now held, ready to continue when asked with `resume_from`."""
    cannot_continue: list[str] = []
    """Saved agents of restart_only environments: their state was never saved, so they start over."""
    held: list[HeldBoundary] = []
    """For a restore from the journal: where each held rollout stands (the controller has no agents file)."""


class FaultPlan(Wire):
    """Body of `POST /checkpoint/faults` (served only with fault injection on); replaces the plan."""

    fail: dict[CheckpointRoute, Annotated[int, Field(ge=0)]] = {}
    """The next N calls of each route fail with HTTP `status` before doing anything."""
    status: int = Field(default=500, ge=500, le=599)
    """HTTP status of an injected failure."""
    enospc: dict[Literal["commit"], Annotated[int, Field(ge=0)]] = {}
    """The next N commits raise OSError(ENOSPC) inside the write (reported as HTTP 507, `io_error`)."""
    delay_s: dict[CheckpointRoute, Annotated[float, Field(ge=0)]] = {}
    """Seconds every call of a route takes after it has acted (a slow drain or a slow write), until the plan changes."""
    tool_delay_s: dict[str, Annotated[float, Field(ge=0)]] = {}
    """Environment servers: every tool call of the named environment's agents takes this many seconds longer (a
    slow tool that keeps agents mid-rollout), until the plan changes."""
    crash_rollouts: dict[str, Annotated[int, Field(ge=0)]] = {}
    """Environment servers: the next N rollouts of each named environment fail at once, as if their tool crashed
    (a live failure of one sibling)."""
