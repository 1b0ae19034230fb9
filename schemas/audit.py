"""`<run_dir>/audit.jsonl`: one line per lifecycle event of every group and sibling.

Written durably by the controller (and by the environment server for turn commits),
read by `turnkeep chaos` to check DESIGN.md's invariants after the fact. Every line
has `t` (unix seconds), `inc` (controller incarnation) and `event`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Annotated, Literal, Union

from pydantic import Field, TypeAdapter

from turnkeep.schemas.choices import AgentsFrom, CutKind, HoldChange
from turnkeep.schemas.recovery import SkippedCandidate, SourceKind
from turnkeep.schemas.wire import Wire


class _Event(Wire):
    t: float
    """Wall-clock time (unix seconds)."""
    inc: int
    """Controller incarnation that wrote the line (1 for the first start)."""


class RunStarted(_Event):
    event: Literal["run_started"] = "run_started"
    run_id: str
    pid: int
    resumed: bool
    """False for a new run, True for a restart on an existing run directory."""


class RowRef(Wire):
    group_id: str
    sibling: int
    rollout_id: str


class ContinuationRef(Wire):
    rollout_id: str
    """The saved attempt (attempt N)."""
    next_rollout_id: str
    """The attempt that continues it (attempt N+1)."""
    group_id: str
    sibling: int
    turn_index: int
    """Turns completed at the saved boundary."""
    boundary_sha: str
    """`segments_digest` of the saved boundary's segments."""
    started_by: int = 0
    """The incarnation that started the saved attempt (rollout ids repeat across lineages)."""
    partial_tokens: int = 0
    """Tokens of the cut turn after the boundary that the continuation keeps (the `token` level)."""


class KeptStep(Wire):
    step: int
    group_ids: list[str]


class KeptAfterCut(Wire):
    """What a restore kept of the journal after its cut (`rollout_recovery.keep_after_cut`)."""

    records: int
    """Journal records applied after the cut."""
    undone_steps: list[int]
    """Trainer steps after the cut, lost with the trainer: their groups are open again and train again first."""
    newest_policy_version: int
    """The newest policy version whose rows and turns the restore kept (the last undone step's, or the cut's)."""
    journal: str = ""
    """The journal read past the cut: the cut's own (`journal/inc-<n>`), or that of a later incarnation that
    restored the same cut and died before it saved anything newer (it holds everything since)."""
    stopped: str | None = None
    """Why the journal was not read to its last record (damage), or None."""
    kept_steps: list[KeptStep] = []
    """Trainer steps after the cut kept, not undone: the trainer that trained them survived a controller that died
    alone, and the journals reach its step (the restore's `step`)."""


class Restored(_Event):
    event: Literal["restored"] = "restored"
    source: SourceKind
    step: int
    policy_version: int
    snapshot_dir: str | None
    checkpoint_dir: str | None
    reason: str
    skipped: list[SkippedCandidate]
    cut_unix_s: float | None
    """When the restored state was captured (None for a fresh start)."""
    rows: list[RowRef]
    """Finished rows in the restored data plane."""
    continuations: list[ContinuationRef]
    unfinished_groups: list[str]
    """Groups in the restored recovery ledger (not yet trained or discarded)."""
    next_group_index: int
    """Dataloader position restored."""
    agents_not_continued: list[str] = []
    """Saved agents (attempt N) of the snapshot, or for a restore from the turn journals the running ones, that
    this restore reruns from scratch instead of continuing, because their environment's recovery level does not
    continue saved turns. Empty in logs from before it."""
    kept_after_cut: KeptAfterCut | None = None
    """None: the restore brought back exactly its cut (a fresh start, a parked snapshot, keep_after_cut off, or a
    log from before it)."""
    agents_from: AgentsFrom = AgentsFrom.SNAPSHOT
    """Where the continued agents came from: the snapshot's saved agents (checked against its cut), or the
    environment servers' turn journals (a trainer checkpoint without a snapshot)."""


class GroupAdmitted(_Event):
    event: Literal["group_admitted"] = "group_admitted"
    group_id: str
    size: int
    env: str = "calc"
    """The environment that runs the group."""


class SiblingStarted(_Event):
    event: Literal["sibling_started"] = "sibling_started"
    rollout_id: str
    group_id: str
    sibling: int
    attempt: int
    resumed_from: str | None = None
    """The saved attempt this one continues (None when it starts from scratch)."""
    resumed_turn: int = 0


class TurnCommitted(_Event):
    event: Literal["turn_committed"] = "turn_committed"
    rollout_id: str
    group_id: str
    sibling: int
    attempt: int
    turn: int
    """1-based index of the turn just completed."""
    policy_version: int
    tokens: int
    """Tokens the policy generated in this turn."""
    carried: int = 0
    """Of those, tokens an earlier attempt generated before a crash cut the turn (the `token` level)."""
    started_by: int = 0
    """The controller incarnation that started this attempt (the request's)."""


class TurnTokens(_Event):
    """Tokens of a turn still being generated: streamed so far (`durable` false; counted by the figures when a
    kill cuts the turn), or journaled and durable (the `token` level: a restore that continues this attempt after
    `turn` turns must keep at least these)."""

    event: Literal["turn_tokens"] = "turn_tokens"
    rollout_id: str
    turn: int
    """Turns completed before the one being generated."""
    tokens: int
    """Tokens of that turn so far."""
    policy_version: int
    """The newest policy version among them."""
    started_by: int = 0
    """The controller incarnation that started this attempt (the request's)."""
    durable: bool = False
    """In the turn journal on disk (not just streamed)."""


class SiblingSealed(_Event):
    event: Literal["sibling_sealed"] = "sibling_sealed"
    rollout_id: str
    group_id: str
    sibling: int
    attempt: int
    num_turns: int
    generated_tokens: int
    policy_versions: list[int]
    """Policy version of every policy turn in the row."""
    resumed_turn: int = 0
    """Turns the row took over from a saved boundary (0 when it never was restored)."""
    prefix_sha: str | None = None
    """`segments_digest` of the row's segments that came from the saved boundary."""


class SiblingFailed(_Event):
    event: Literal["sibling_failed"] = "sibling_failed"
    rollout_id: str
    group_id: str
    sibling: int
    attempt: int
    reason: str
    will_retry: bool


class ReplayChecked(_Event):
    """A restored agent of a `stateless` or `replay` environment rebuilt by replaying its turns on a fresh instance."""

    event: Literal["replay_checked"] = "replay_checked"
    rollout_id: str
    """The attempt that continues (or, when the replay failed, reruns) the sibling."""
    resumed_from: str
    """The saved attempt whose turns were replayed."""
    env: str
    turns: int
    """Policy turns replayed."""
    seconds: float
    diverged_turn: int | None = None
    """The first turn whose observation differed from the journaled one (None: every one matched)."""
    reason: str = ""
    """Why the replay failed (a difference, its time limit, an error); empty when it matched."""


class StepTrained(_Event):
    event: Literal["step_trained"] = "step_trained"
    step: int
    """The step this optimizer update produced ("trained at step N")."""
    policy_version: int
    group_ids: list[str]


class GroupsDiscarded(_Event):
    event: Literal["groups_discarded"] = "groups_discarded"
    group_ids: list[str]
    reason: str


class GroupRerun(_Event):
    event: Literal["group_rerun"] = "group_rerun"
    group_id: str
    round: int
    """The round the group starts now (1 for its first rerun)."""
    cause: Literal["group_scored_failure", "prompt_group_failure", "prompt_group_restore"]
    """A live failure in a group-scored environment, or one at the prompt_group level, or a restore at that level."""
    reason: str
    discarded_siblings: list[int]
    """Sealed siblings whose rows this rerun threw away."""


class GroupDropped(_Event):
    event: Literal["group_dropped"] = "group_dropped"
    group_id: str
    reason: str
    """The failure that used the group's last whole-group round; its rows are deleted now and the train pump
    discards the group later (`groups_discarded`)."""


class DeadlineExpired(_Event):
    event: Literal["deadline_expired"] = "deadline_expired"
    rollout_id: str
    budget_s: float
    running_s: float
    """Time the deadline's clock ran (parked time excluded)."""


class SnapshotPublished(_Event):
    event: Literal["snapshot_published"] = "snapshot_published"
    checkpoint_id: str
    step: int
    snapshot_dir: str
    cut_unix_s: float


class CutTaken(_Event):
    """The controller's state captured under the data-plane barrier (a snapshot attempt's cut, or the state a
    trainer checkpoint saves): counts and digests (`ids_digest`) rather than lists, so the line stays small
    however many rows the data plane holds. A restore of this state reports the same `cut_unix_s`."""

    event: Literal["cut_taken"] = "cut_taken"
    kind: CutKind
    step: int
    cut_unix_s: float
    """The `cut_unix_s` saved in the state."""
    rows: int
    rows_digest: str
    """Of `row_key` of every row in the data plane."""
    groups: int
    groups_digest: str
    """Of the id of every unfinished group (the group ledger)."""
    next_group_index: int
    """Dataloader position saved."""
    continuations: int = 0
    continuations_digest: str = ""
    """Of the rollout id (attempt N) of every saved agent the cut checked (none for a trainer checkpoint)."""


class HoldChanged(_Event):
    """A holder added to, renewed in or released from a hold set: the controller's own, or the trainer's and
    the policy server's as sampled by `controller.remote_holds`."""

    event: Literal["hold_changed"] = "hold_changed"
    change: HoldChange
    holder: str
    holds: list[str]
    """Hold sets by name: `admission`, `deadlines` (as in `run_ended`), `trainer`, `policy_admission`."""
    lease_s: float | None = None
    """Seconds from `t` until the holder's lease runs out (None: no lease, or a release)."""


class RunEnded(_Event):
    event: Literal["run_ended"] = "run_ended"
    step: int
    reason: str
    """`finished`, `preempted` or `stopped: ...`."""
    outstanding_groups: list[str]
    """Groups still unfinished (they live on in the newest checkpoint and snapshot)."""
    admission_holders: list[str]
    deadline_holders: list[str]
    trainer_holders: list[str]


AuditEvent = Annotated[
    Union[
        RunStarted, Restored, GroupAdmitted, SiblingStarted, TurnCommitted, TurnTokens, SiblingSealed,
        SiblingFailed, ReplayChecked,
        StepTrained, GroupsDiscarded, GroupRerun, DeadlineExpired, SnapshotPublished, RunEnded,
        CutTaken, GroupDropped, HoldChanged,
    ],
    Field(discriminator="event"),
]
AUDIT_EVENT = TypeAdapter(AuditEvent)


def row_key(group_id: str, sibling: int) -> str:
    """A data-plane row's id in `cut_taken` digests: `<group_id>.<sibling>`."""
    return f"{group_id}.{sibling}"


def ids_digest(ids: Iterable[str]) -> str:
    """Digest of a set of ids, whatever their order (24 hex digits): what `cut_taken` records of a cut."""
    return IdsDigest(ids).hexdigest()


_DIGEST_MODULUS = 1 << 96


class IdsDigest:
    """`ids_digest` kept up to date one id at a time: the sum of each id's hash, modulo 2**96.

    A sum, unlike a hash of the sorted list, changes in O(1) when an id comes or goes, so the
    data plane knows its rows' digest at any moment and a cut reads it without touching a row.
    Callers add an id at most once (the data plane ignores a duplicate row).
    """

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._sum = 0
        for one in ids:
            self.add(one)

    @staticmethod
    def _hash(one: str) -> int:
        return int.from_bytes(hashlib.sha256(one.encode()).digest()[:12], "big")

    def add(self, one: str) -> None:
        self._sum = (self._sum + self._hash(one)) % _DIGEST_MODULUS

    def remove(self, one: str) -> None:
        self._sum = (self._sum - self._hash(one)) % _DIGEST_MODULUS

    def hexdigest(self) -> str:
        return f"{self._sum:024x}"
