"""The controller's write-ahead journal: every change to its state, as it happens.

The data plane, the group ledger, the dataloader and the train pump call `record` for
each change, on the event loop's one thread and at the moment of the change, so the
journal's order is the order of the changes and `position()` taken under the data-plane
barrier marks exactly the state a cut sees. A cut or a trainer checkpoint then records a
position (O(1)) instead of copying every row (O(rows)); a restore replays the journal
from a base state to that position (`replay.state_at`).

Each incarnation writes its own journal, `<run_dir>/journal/inc-<n>/`, which starts from
a base: the state it restored (or a fresh run's empty state), written once at start-up.
A trainer checkpoint's `controller_state.json` is the full state at its position and
becomes the base of later cuts, so the segments before the oldest kept checkpoint are
never read again and are pruned (`journal_prune`).

A row's record is made durable before its environment server gets the ACK: a result the
server forgets is always in the journal. The other records (admissions, the dataloader, train
steps) are written within `journal_flusher.JOURNAL_FLUSH_S` while the pumps run.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from turnkeep.controller.journal.records import encode
from turnkeep.primitives.atomic_files import atomic_write_bytes
from turnkeep.primitives.segment_format import LogPosition
from turnkeep.primitives.segment_log import SegmentLog

JOURNAL_DIR = "journal"
BASE_KEY = "journal_base"
"""In a base file (an incarnation's start, a trainer checkpoint's controller state): where in which journal it is."""
START_FILE = "start.json"
RESTORED_FROM_FILE = "restored_from.json"
"""Beside a restored incarnation's base: the journal position of the cut its restore kept the journal past
({"log_id", "position", "newest_policy_version"}), so a later restore of the same cut goes on from this journal."""


class JournalRef(BaseModel):
    """Where a cut's state lies: a base file, and the journal position to replay it to (paths relative to the run
    directory), with the counts and digests the replayed state must show."""

    model_config = ConfigDict(extra="forbid")
    journal: str
    log_id: str
    base: str
    base_position: dict
    position: dict
    rows: int
    rows_digest: str
    groups: int
    groups_digest: str


class JournalHooks:
    """What the state's owners call on each change; this one journals nothing (a controller that never started
    its journal, as in unit tests of one piece)."""

    started = False

    def record(self, kind: str, value: Any) -> int:
        return 0

    async def durable(self, seq: int) -> None:
        return None

    async def flush_pending(self) -> None:
        return None

    def close(self) -> None:
        return None


NO_JOURNAL = JournalHooks()


class JournalSwitch(JournalHooks):
    """The journal the data plane, the group ledger and the dataloader are built with: one switch they share, which
    the controller points at each incarnation's journal (`Controller.start_journal`). Until then it journals nothing;
    anything else read of it (a cut's position, a checkpoint's base) is the journal's it points at."""

    def __init__(self) -> None:
        self.current: JournalHooks = NO_JOURNAL

    def switch_to(self, journal: JournalHooks) -> None:
        self.current = journal

    @property
    def started(self) -> bool:
        return self.current.started

    def record(self, kind: str, value: Any) -> int:
        return self.current.record(kind, value)

    async def durable(self, seq: int) -> None:
        await self.current.durable(seq)

    async def flush_pending(self) -> None:
        await self.current.flush_pending()

    def close(self) -> None:
        self.current.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)


def incarnation_dir(run_dir: Path, incarnation: int) -> Path:
    return Path(run_dir) / JOURNAL_DIR / f"inc-{incarnation:06d}"


class StateJournal(JournalHooks):
    started = True

    def __init__(self, run_dir: Path, run_id: str, incarnation: int, base_state: dict,
                 segment_bytes: int = 64 << 20, restored_from: dict | None = None) -> None:
        """Start this incarnation's journal from `base_state` (what the controller holds right now)."""
        self.run_dir = Path(run_dir)
        self.directory = incarnation_dir(run_dir, incarnation)
        self.log_id = f"{run_id}/inc-{incarnation}"
        if self.directory.exists():
            # A restore retried within one incarnation starts over: nothing refers to this journal yet.
            _remove_tree(self.directory)
        self.directory.mkdir(parents=True)
        start = LogPosition(seq=0, chain="00" * 32)
        self._base_file = self.directory / START_FILE
        write_base(self._base_file, base_state, self, start)
        if restored_from is not None:
            atomic_write_bytes(self.directory / RESTORED_FROM_FILE, orjson.dumps(restored_from))
        self._base_position = start
        self._previous_base_seq = start.seq
        self._log = SegmentLog(self.directory, self.log_id, segment_bytes=segment_bytes, base=start)

    def record(self, kind: str, value: Any) -> int:
        return self._log.append(encode(kind, value))

    def position(self) -> LogPosition:
        return self._log.position()

    async def durable(self, seq: int) -> None:
        await self._log.durable(seq)

    async def sync(self) -> LogPosition:
        return await self._log.sync()

    async def flush_pending(self) -> None:
        """Make the records appended so far durable, if any are not."""
        end = self._log.position().seq
        if end > self._log.durable_seq:
            await self._log.durable(end)

    def sync_blocking(self) -> LogPosition:
        """Everything appended, on disk now (no event loop: tests, shutdown)."""
        return self._log.sync_blocking()


    def ref(self, position: LogPosition, rows: int, rows_digest: str, groups: int, groups_digest: str) -> JournalRef:
        return JournalRef(
            journal=str(self.directory.relative_to(self.run_dir)), log_id=self.log_id,
            base=str(self._base_file.relative_to(self.run_dir)), base_position=self._base_position.to_dict(),
            position=position.to_dict(), rows=rows, rows_digest=rows_digest, groups=groups,
            groups_digest=groups_digest,
        )

    @property
    def keep_from_seq(self) -> int:
        """Where pruning may cut this journal: the base before the current one, so a cut that named the previous
        base a moment before a rebase (its state not written yet) still finds its records."""
        return self._previous_base_seq

    def rebase(self, base_file: Path, position: LogPosition) -> None:
        """A trainer checkpoint holding the full state at `position` is published: later cuts replay from it."""
        if position.seq >= self._base_position.seq:
            self._previous_base_seq = self._base_position.seq
            self._base_file, self._base_position = Path(base_file), position

    def close(self) -> None:
        self._log.close()


def base_marker(journal: StateJournal, position: LogPosition) -> dict:
    return {"journal": str(journal.directory.relative_to(journal.run_dir)), "log_id": journal.log_id,
            "position": position.to_dict()}


def write_base(path: Path, state: dict, journal: StateJournal, position: LogPosition) -> None:
    atomic_write_bytes(path, orjson.dumps({**state, BASE_KEY: base_marker(journal, position)}))


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path)
