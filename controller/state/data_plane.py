"""Finished rollout rows waiting to be trained on, behind one barrier.

Rows are written only after the environment server returned them and before their
receipt is ACKed, so a row is either here or still owned by the server. The barrier
(an asyncio lock) is what a snapshot's cut takes: while it is held no row is written
or deleted. Its receipt joins `pending_acks` under the barrier with the row; the ACK
itself is sent after the barrier opens (see `pending_acks`).

Every change is also a journal record (`controller.journal`), and the data plane keeps
its row count and the digest of its row keys up to date as rows come and go, so a cut
reads a journal position, a count and a digest: nothing it does grows with the rows.
"""

from __future__ import annotations

import asyncio

import orjson

from turnkeep.controller.journal.records import REWARDS, ROW, ROWS_DELETED
from turnkeep.controller.journal.state_journal import NO_JOURNAL, JournalHooks
from turnkeep.controller.state.pending_acks import PendingAcks
from turnkeep.schemas.audit import IdsDigest, row_key
from turnkeep.schemas.rollout import RolloutRow


class DataPlane:
    def __init__(self, journal: JournalHooks = NO_JOURNAL) -> None:
        self._rows: dict[str, dict[int, RolloutRow]] = {}
        self.barrier = asyncio.Lock()
        self.pending_acks = PendingAcks()
        self.journal = journal
        self.last_record = 0
        """The journal position after the newest row's record: what an ACK waits to be durable."""
        self._count = 0
        self._digest = IdsDigest()

    def put(self, row: RolloutRow) -> bool:
        """Store a sealed row; a duplicate delivery of the same sibling is ignored (returns False)."""
        siblings = self._rows.setdefault(row.group_id, {})
        if row.sibling in siblings:
            return False
        siblings[row.sibling] = row
        self._count += 1
        self._digest.add(row_key(row.group_id, row.sibling))
        self.last_record = self.journal.record(ROW, orjson.Fragment(row.model_dump_json()))
        return True

    def rows(self, group_id: str) -> list[RolloutRow]:
        return [row for _, row in sorted(self._rows.get(group_id, {}).items())]

    def has_row(self, group_id: str, sibling: int) -> bool:
        return sibling in self._rows.get(group_id, {})

    def sealed_count(self, group_id: str) -> int:
        return len(self._rows.get(group_id, {}))

    def set_rewards(self, group_id: str, rewards: list[float]) -> None:
        """Replace a group's rewards (a group-scored environment's judge scored all its rows together)."""
        rows = self._rows[group_id]
        if len(rewards) != len(rows):
            raise ValueError(f"{len(rewards)} rewards for the {len(rows)} rows of group {group_id}")
        for (sibling, row), reward in zip(sorted(rows.items()), rewards):
            rows[sibling] = row.model_copy(update={"reward": reward})
        self.journal.record(REWARDS, {"group_id": group_id, "rewards": rewards})

    def delete(self, group_ids: list[str]) -> None:
        for group_id in group_ids:
            for sibling in self._rows.pop(group_id, {}):
                self._count -= 1
                self._digest.remove(row_key(group_id, sibling))
        self.journal.record(ROWS_DELETED, list(group_ids))

    def group_ids(self) -> list[str]:
        return sorted(self._rows)

    def num_rows(self) -> int:
        return self._count

    def rows_digest(self) -> str:
        """`ids_digest` of every row's `row_key`, kept as rows come and go."""
        return self._digest.hexdigest()

    def state_dict(self) -> dict:
        return {"rows": [row.model_dump() for gid in sorted(self._rows) for row in self.rows(gid)]}

    def load_state_dict(self, state: dict) -> None:
        """Restore rows without journaling them: the restored state is the next journal's base."""
        self._rows.clear()
        self._count, self._digest = 0, IdsDigest()
        journal, self.journal = self.journal, NO_JOURNAL
        try:
            for raw in state["rows"]:
                self.put(RolloutRow.model_validate(raw))
        finally:
            self.journal = journal
