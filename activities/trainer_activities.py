"""Trainer activities: they run in the trainer process, on `<run_id>.trainer`, because the
hold they take and release lives there."""

from __future__ import annotations

import time
from typing import Protocol

from temporalio import activity

from turnkeep.activities.errors import stale_incarnation
from turnkeep.activities.input_checks import check_holder, check_lease
from turnkeep.primitives.hold_wait_clock import HoldWaitClock
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.attempt_steps import (
    TRAINER_HOLD,
    TRAINER_RELEASE,
    TrainerHoldInput,
    TrainerHoldResult,
    TrainerReleaseInput,
    TrainerReleaseResult,
)


class TrainerPosition(Protocol):
    step: int
    """The last committed train step."""
    policy_version: int


class TrainerActivities:
    def __init__(self, hold: HoldSet, trainer: TrainerPosition, wait_clock: HoldWaitClock, incarnation: int) -> None:
        self._hold = hold
        self._trainer = trainer
        self._wait_clock = wait_clock
        self._incarnation = incarnation

    @activity.defn(name=TRAINER_HOLD)
    async def hold(self, inp: TrainerHoldInput) -> TrainerHoldResult:
        if inp.incarnation is not None and inp.incarnation != self._incarnation:
            # An attempt left open by a dead controller must not stall this one's trainer.
            raise stale_incarnation(inp.incarnation, self._incarnation)
        check_holder("holder", inp.holder)
        check_lease("lease_s", inp.lease_s)
        for i, holder in enumerate(inp.release_also):
            check_holder(f"release_also[{i}]", holder)
        if self._hold.add(inp.holder, inp.lease_s):
            self._wait_clock.added_at[inp.holder] = time.monotonic()
        for replaced in inp.release_also:
            self._hold.release(replaced)
            self._wait_clock.added_at.pop(replaced, None)
        return TrainerHoldResult(step=self._trainer.step, policy_version=self._trainer.policy_version)

    @activity.defn(name=TRAINER_RELEASE)
    async def release(self, inp: TrainerReleaseInput) -> TrainerReleaseResult:
        for i, holder in enumerate(inp.holders):
            check_holder(f"holders[{i}]", holder)
        waited = 0.0
        released = False
        for holder in inp.holders:
            waited = max(waited, self._wait_clock.waited_on(holder))
            released = self._hold.release(holder) or released
        return TrainerReleaseResult(released=released, waited_s=round(waited, 3))
