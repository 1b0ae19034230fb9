"""Turn boundary records: the newest committed boundary of every running rollout.

A rollout can be continued from its record alone, so this is what a snapshot saves for
each parked agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkeep.schemas.rollout import RolloutRequest, TurnBoundary

if TYPE_CHECKING:
    from turnkeep.envs.environment import Environment
    from turnkeep.envs.turn_journal import TurnJournal


class TurnRecords:
    def __init__(self, journal: TurnJournal | None = None) -> None:
        self._latest: dict[str, TurnBoundary] = {}
        self.commits = 0
        self.journal = journal
        """The server's turn journal when it journals its boundaries (`envs.turn_journal`)."""

    def commit(self, record: TurnBoundary, request: RolloutRequest | None = None, env: Environment | None = None,
               ) -> None:
        """Make `record` the rollout's newest boundary; with its request, journal it too (with the environment's
        exported state at this boundary)."""
        previous = self._latest.get(record.rollout_id)
        if previous is not None and record.turn_index <= previous.turn_index:
            raise ValueError(
                f"turn boundary for {record.rollout_id} went from {previous.turn_index} to {record.turn_index}"
            )
        self._latest[record.rollout_id] = record
        self.commits += 1
        if self.journal is not None and request is not None:
            self.journal.committed(request, record, env.export_state() if env is not None else None, record.done)

    def latest(self, rollout_id: str) -> TurnBoundary | None:
        return self._latest.get(rollout_id)

    def forget(self, rollout_id: str) -> None:
        self._latest.pop(rollout_id, None)
        if self.journal is not None:
            self.journal.forget(rollout_id)

    def __len__(self) -> int:
        return len(self._latest)
