"""The trainer's and the policy server's hold sets, seen from the controller's audit log.

Those hold sets live in other processes, so their holders are sampled every `SAMPLE_S`
and each change is written as `hold_changed` (hold set `trainer` or `policy_admission`),
as the controller's own hold sets are. The checker then measures them against their
leases while the run lives (invariant 4), not only at a clean end. A holder that comes
and goes within one sample may be missed; one that stays (the case the check is for)
never is. A last sample is taken just before `run_ended`, so a release right before the
end is not mistaken for a holder left behind.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger("turnkeep.holds")

SAMPLE_S = 2.0
SAMPLE_TIMEOUT_S = 5.0
"""A process that does not answer within this is skipped for one sample (a hung one must not hang the end)."""
RENEWAL_MIN_S = 1.0
"""A lease end that moved later by more than this between samples was renewed (less is sampling jitter)."""

Sampler = Callable[[], Awaitable[list[tuple[str, float | None]]]]
"""Returns every holder of one remote hold set with its remaining lease in seconds (None: no lease)."""
Emit = Callable[..., None]
"""`controller.audit_hold(change, holder, holds, lease_s)`."""


@dataclass
class Change:
    change: str
    holder: str
    lease_s: float | None


def diff(previous: dict[str, float | None], current: list[tuple[str, float | None]], now: float) -> tuple[
        list[Change], dict[str, float | None]]:
    """Changes between two samples, and the new sample as holder -> when its lease runs out (None: no lease)."""
    seen = {name: None if remaining is None else now + remaining for name, remaining in current}
    changes: list[Change] = []
    for name, remaining in current:
        if name not in previous:
            changes.append(Change("taken", name, remaining))
        elif seen[name] is not None and (previous[name] is None or seen[name] > previous[name] + RENEWAL_MIN_S):
            changes.append(Change("renewed", name, remaining))
    changes += [Change("released", name, None) for name in sorted(set(previous) - set(seen))]
    return changes, seen


class RemoteHoldWatch:
    def __init__(self, samplers: dict[str, Sampler], emit: Emit, clock: Callable[[], float] = time.time) -> None:
        self._samplers = samplers
        self._emit = emit
        self._clock = clock
        self._seen: dict[str, dict[str, float | None]] = {name: {} for name in samplers}
        self._failing: set[str] = set()

    async def sample(self) -> None:
        for hold, sampler in self._samplers.items():
            try:
                current = await asyncio.wait_for(sampler(), SAMPLE_TIMEOUT_S)
            except Exception as err:  # a process that died is reported by its own watch, once
                if hold not in self._failing:
                    log.info("hold set %s cannot be sampled: %s", hold, err)
                    self._failing.add(hold)
                continue
            self._failing.discard(hold)
            changes, self._seen[hold] = diff(self._seen[hold], current, self._clock())
            for change in changes:
                self._emit(change.change, change.holder, [hold], change.lease_s)

    def holders(self) -> dict[str, list[str]]:
        """Every remote hold set's holders as last sampled."""
        return {hold: sorted(seen) for hold, seen in self._seen.items()}

    async def run(self, every_s: float = SAMPLE_S, after_each: Callable[[], None] | None = None) -> None:
        while True:
            await self.sample()
            if after_each is not None:
                try:
                    after_each()
                except OSError as err:  # a full disk must not stop the sampling (and the hold events)
                    log.warning("could not write the run's live status: %s", err)
            await asyncio.sleep(every_s)


def process_samplers(processes) -> dict[str, Sampler]:
    """The trainer's hold set and the engines' admission gates (one view: every holder with its shortest lease),
    asked through their Ray actors."""
    async def trainer() -> list[tuple[str, float | None]]:
        return await processes.trainer.hold_leases.remote()

    async def policy() -> list[tuple[str, float | None]]:
        return await processes.engines.admission_leases()

    return {"trainer": trainer, "policy_admission": policy}


async def stop_watching(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
