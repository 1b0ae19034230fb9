"""The controller's side of snapshot attempts: what the attempt's activities work on.

It closes and reopens admission and the rollout deadlines (one holder per attempt in
both hold sets), renews every lease an attempt holds, and remembers across activities
what an attempt changed: when admission closed, the progress marker at its cut, the
time of its cut. The controller's Temporal worker builds one per incarnation.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from turnkeep.participants.client import ParticipantClient
from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.schemas.choices import MetricsKind
from turnkeep.schemas.names import snapshot_holder
from turnkeep.schemas.snapshot import SnapshotAttemptResult

if TYPE_CHECKING:
    from turnkeep.controller.runtime import Controller


log = logging.getLogger("turnkeep.snapshot")


@dataclass
class SnapshotCoordinator:
    run_id: str
    incarnation: int
    run_dir: Path
    fingerprint: str
    controller: "Controller"
    trainer: object
    """Ray handle of the trainer actor (renews its hold lease)."""
    environments: list[ParticipantClient]
    """Participants that park agents (the policy server is driven by its own activities, after them)."""
    interval_s: float | None
    """Between periodic attempts; None: attempts at trainer checkpoints only."""
    admission_closed_at: dict[str, float] = field(default_factory=dict)
    last_published_marker: tuple | None = None
    cut_markers: dict[str, tuple] = field(default_factory=dict)
    """Progress marker taken at each attempt's cut, promoted when that attempt publishes."""
    warned_long_closure: bool = False
    cut_times: dict[str, float] = field(default_factory=dict)
    """Wall-clock time of each attempt's cut (the audit log's snapshot_published)."""

    def is_stale(self, incarnation: int) -> bool:
        """An activity of an earlier controller incarnation (left open by a crash)."""
        return incarnation < self.incarnation

    async def progress_marker(self) -> tuple:
        """Changes whenever anything a snapshot would save has changed."""
        c = self.controller
        health = await c.env_client.health()
        return (c.training.step, c.dataloader.next_index, c.stats.rows_sealed, c.data_plane.num_rows(),
                int(health["turn_commits"]))

    def close_admission(self, checkpoint_id: str, lease_s: float) -> None:
        holder = snapshot_holder(checkpoint_id)
        self.controller.admission.add(holder, lease_s)
        self.controller.deadline_holds.add(holder, lease_s)
        self.controller.audit_hold("taken", holder, ["admission", "deadlines"], lease_s)
        self.admission_closed_at.setdefault(checkpoint_id, time.monotonic())

    def reopen_admission(self, checkpoint_id: str) -> float:
        """Release this attempt's admission and deadline holds; seconds they were held."""
        holder = snapshot_holder(checkpoint_id)
        self.controller.admission.release(holder)
        self.controller.deadline_holds.release(holder)
        self.controller.audit_hold("released", holder, ["admission", "deadlines"])
        closed_at = self.admission_closed_at.pop(checkpoint_id, None)
        return 0.0 if closed_at is None else time.monotonic() - closed_at

    async def renew_leases(self, checkpoint_id: str, lease_s: float, participants: bool = True) -> None:
        holder = snapshot_holder(checkpoint_id)
        for holds in (self.controller.admission, self.controller.deadline_holds):
            if holder in holds.holders():
                holds.renew(holder, lease_s)
                self.controller.audit_hold("renewed", holder, [holds.name], lease_s)
        await self.trainer.hold_renew.remote(holder, lease_s)
        if participants:
            for participant in self.environments:
                await participant.renew(checkpoint_id, lease_s)

    async def skip_reason(self, anchor_step: int) -> str | None:
        """Why an attempt anchored at `anchor_step` is not worth taking now (None: take it).

        The train pump is the one source of both numbers: the step it committed and the
        step of the newest trainer checkpoint it wrote (or restored from).
        """
        training = self.controller.training
        newest = training.checkpointed_step
        if newest is None:
            return "no trainer checkpoint yet"
        if training.step != newest or anchor_step != training.step:
            return f"no trainer checkpoint for the current step {training.step} (newest is step_{newest})"
        if self.last_published_marker == await self.progress_marker():
            return "nothing changed since the last published snapshot"
        return None

    async def mark_cut(self, checkpoint_id: str) -> None:
        """Take the progress marker under the cut's barrier; it counts as "published" only once publish
        succeeds, so a failed attempt never causes a skip."""
        self.cut_markers[checkpoint_id] = await self.progress_marker()

    def note_published(self, checkpoint_id: str, anchor_step: int, snapshot_dir: Path) -> None:
        self.last_published_marker = self.cut_markers.pop(checkpoint_id, self.last_published_marker)
        self.controller.audit_snapshot(checkpoint_id, anchor_step, str(snapshot_dir),
                                       self.cut_times.pop(checkpoint_id, time.time()))

    def record(self, result: SnapshotAttemptResult, consecutive_failures: int) -> str | None:
        """Every attempt's outcome into metrics.jsonl and the progress output; returns a warning, at most once a run."""
        warning = None
        if self.interval_s is not None and result.admission_closed_s > self.interval_s and not self.warned_long_closure:
            self.warned_long_closure = True
            warning = (
                f"snapshot {result.checkpoint_id} kept new rollouts stopped for {result.admission_closed_s:.1f}s, "
                f"longer than snapshot.attempt_interval_s = {self.interval_s:g}s: snapshots pause generation for a "
                "large share of the run. Raise snapshot.attempt_interval_s (or speed up the slow participant)."
            )
            log.warning(warning)
        line = {"kind": MetricsKind.SNAPSHOT, "t": round(time.time(), 3), **result.model_dump(mode="json"),
                "consecutive_failures": consecutive_failures}
        if warning:
            line["warning"] = warning
        append_jsonl(self.run_dir / "metrics.jsonl", line, durable=False)
        self.controller.metrics.snapshot(result)
        return warning
