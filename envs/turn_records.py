"""Turn boundary records: the newest committed boundary of every running rollout.

A rollout can be continued from its record alone, so this is what a snapshot saves for
each parked agent.
"""

from __future__ import annotations

from schemas.rollout import TurnBoundary


class TurnRecords:
    def __init__(self) -> None:
        self._latest: dict[str, TurnBoundary] = {}
        self.commits = 0

    def commit(self, record: TurnBoundary) -> None:
        previous = self._latest.get(record.rollout_id)
        if previous is not None and record.turn_index <= previous.turn_index:
            raise ValueError(
                f"turn boundary for {record.rollout_id} went from {previous.turn_index} to {record.turn_index}"
            )
        self._latest[record.rollout_id] = record
        self.commits += 1

    def latest(self, rollout_id: str) -> TurnBoundary | None:
        return self._latest.get(rollout_id)

    def forget(self, rollout_id: str) -> None:
        self._latest.pop(rollout_id, None)

    def __len__(self) -> int:
        return len(self._latest)
