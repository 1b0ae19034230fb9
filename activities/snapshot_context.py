"""What the controller's snapshot activities work on, handed over by the controller's worker."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from activities.errors import stale_incarnation
from participants.client import ParticipantClient

if TYPE_CHECKING:
    from controller.runtime import Controller


@dataclass
class SnapshotContext:
    run_id: str
    incarnation: int
    run_dir: Path
    fingerprint: str
    controller: "Controller"
    trainer: object
    """Ray handle of the trainer actor (renews its hold lease)."""
    environments: list[ParticipantClient]
    """Participants that park agents; prepared first."""
    policy: ParticipantClient
    """The policy server; prepared after every agent is parked."""
    interval_s: float
    admission_closed_at: dict[str, float] = field(default_factory=dict)
    last_published_marker: tuple | None = None
    cut_markers: dict[str, tuple] = field(default_factory=dict)
    """Progress marker taken at each attempt's cut, promoted when that attempt publishes."""
    warned_long_closure: bool = False
    recorded: list = field(default_factory=list)
    """Every attempt result recorded in this incarnation, in order (the preemption handler waits on it)."""
    recorded_changed: asyncio.Event = field(default_factory=asyncio.Event)
    recovery: object | None = None
    """The RecoveryResult of this incarnation's restore (None for a new run)."""
    cut_times: dict[str, float] = field(default_factory=dict)
    """Wall-clock time of each attempt's cut (the audit log's snapshot_published)."""

    def check(self, incarnation: int) -> None:
        if incarnation != self.incarnation:
            raise stale_incarnation(incarnation, self.incarnation)

    def is_stale(self, incarnation: int) -> bool:
        """An activity of an earlier controller incarnation (left open by a crash)."""
        return incarnation < self.incarnation

    def participants(self) -> list[ParticipantClient]:
        return [*self.environments, self.policy]

    def progress_marker(self, turn_commits: int) -> tuple:
        """Changes whenever anything a snapshot would save has changed."""
        c = self.controller
        return (c.training.step, c.dataloader.next_index, c.stats.rows_sealed, c.data_plane.num_rows(), turn_commits)

    def close_admission(self, checkpoint_id: str, lease_s: float) -> None:
        holder = f"snapshot:{checkpoint_id}"
        self.controller.admission.add(holder, lease_s)
        self.controller.deadline_holds.add(holder, lease_s)
        self.admission_closed_at.setdefault(checkpoint_id, time.monotonic())

    def reopen_admission(self, checkpoint_id: str) -> float:
        """Release this attempt's admission and deadline holds; seconds they were held."""
        holder = f"snapshot:{checkpoint_id}"
        self.controller.admission.release(holder)
        self.controller.deadline_holds.release(holder)
        closed_at = self.admission_closed_at.pop(checkpoint_id, None)
        return 0.0 if closed_at is None else time.monotonic() - closed_at

    async def renew_leases(self, checkpoint_id: str, lease_s: float, participants: bool = True) -> None:
        holder = f"snapshot:{checkpoint_id}"
        for holds in (self.controller.admission, self.controller.deadline_holds):
            if holder in holds.holders():
                holds.renew(holder, lease_s)
        await self.trainer.hold_renew.remote(holder, lease_s)
        if participants:
            for participant in self.participants():
                await participant.renew(checkpoint_id, lease_s)
