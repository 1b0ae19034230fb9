"""Trainer activities: they run in the trainer process, on `<run_id>.trainer`, because the
hold they take and release lives there."""

from __future__ import annotations

import time

from temporalio import activity

from activities.errors import stale_incarnation
from primitives.holds import HoldSet
from schemas.snapshot import TrainerHoldInput, TrainerHoldResult, TrainerReleaseInput, TrainerReleaseResult


class HoldWaitClock:
    """How long the optimizer step waited on each holder (for the attempt's report)."""

    def __init__(self) -> None:
        self.waiting_since: float | None = None
        self.added_at: dict[str, float] = {}

    def waited_on(self, holder: str) -> float:
        added = self.added_at.pop(holder, None)
        if self.waiting_since is None or added is None:
            return 0.0
        return time.monotonic() - max(self.waiting_since, added)


class TrainerActivities:
    def __init__(self, hold: HoldSet, version: "callable", wait_clock: HoldWaitClock, incarnation: int) -> None:
        self._hold = hold
        self._version = version
        self._wait_clock = wait_clock
        self._incarnation = incarnation

    @activity.defn(name="trainer.hold")
    async def hold(self, inp: TrainerHoldInput) -> TrainerHoldResult:
        if inp.incarnation is not None and inp.incarnation != self._incarnation:
            # An attempt left open by a dead controller must not stall this one's trainer.
            raise stale_incarnation(inp.incarnation, self._incarnation)
        if self._hold.add(inp.holder, inp.lease_s):
            self._wait_clock.added_at[inp.holder] = time.monotonic()
        for replaced in inp.release_also:
            self._hold.release(replaced)
            self._wait_clock.added_at.pop(replaced, None)
        version = self._version()
        return TrainerHoldResult(step=version, policy_version=version)

    @activity.defn(name="trainer.release")
    async def release(self, inp: TrainerReleaseInput) -> TrainerReleaseResult:
        waited = 0.0
        released = False
        for holder in inp.holders:
            waited = max(waited, self._wait_clock.waited_on(holder))
            released = self._hold.release(holder) or released
        return TrainerReleaseResult(released=released, waited_s=round(waited, 3))
