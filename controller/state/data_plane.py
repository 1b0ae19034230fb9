"""Finished rollout rows waiting to be trained on, behind one barrier.

Rows are written only after the environment server returned them and before their
receipt is ACKed, so a row is either here or still owned by the server. The barrier
(an asyncio lock) is what a snapshot's cut takes: while it is held no row is written
or deleted. Its receipt joins `pending_acks` under the barrier with the row; the ACK
itself is sent after the barrier opens (see `pending_acks`).
"""

from __future__ import annotations

import asyncio

from controller.state.pending_acks import PendingAcks
from schemas.rollout import RolloutRow


class DataPlane:
    def __init__(self) -> None:
        self._rows: dict[str, dict[int, RolloutRow]] = {}
        self.barrier = asyncio.Lock()
        self.pending_acks = PendingAcks()

    def put(self, row: RolloutRow) -> bool:
        """Store a sealed row; a duplicate delivery of the same sibling is ignored (returns False)."""
        siblings = self._rows.setdefault(row.group_id, {})
        if row.sibling in siblings:
            return False
        siblings[row.sibling] = row
        return True

    def rows(self, group_id: str) -> list[RolloutRow]:
        return [row for _, row in sorted(self._rows.get(group_id, {}).items())]

    def sealed_count(self, group_id: str) -> int:
        return len(self._rows.get(group_id, {}))

    def set_rewards(self, group_id: str, rewards: list[float]) -> None:
        """Replace a group's rewards (a group-scored environment's judge scored all its rows together)."""
        rows = self._rows[group_id]
        if len(rewards) != len(rows):
            raise ValueError(f"{len(rewards)} rewards for the {len(rows)} rows of group {group_id}")
        for (sibling, row), reward in zip(sorted(rows.items()), rewards):
            rows[sibling] = row.model_copy(update={"reward": reward})

    def delete(self, group_ids: list[str]) -> None:
        for group_id in group_ids:
            self._rows.pop(group_id, None)

    def group_ids(self) -> list[str]:
        return sorted(self._rows)

    def num_rows(self) -> int:
        return sum(len(siblings) for siblings in self._rows.values())

    def state_dict(self) -> dict:
        return {"rows": [row.model_dump() for gid in sorted(self._rows) for row in self.rows(gid)]}

    def load_state_dict(self, state: dict) -> None:
        self._rows.clear()
        for raw in state["rows"]:
            self.put(RolloutRow.model_validate(raw))
