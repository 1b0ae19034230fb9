"""A run that stalls says so: no train step and no committed turn for `watchdog.stall_s`.

The watchdog's clock stops while the rollout deadline clocks are paused (a snapshot
pause, a colocated train switch: the deadline hold set is held), as the deadlines
themselves do, so a long snapshot pause is not a stall. On a stall it warns once, naming
what each pump waits on and who holds each gate; it warns again only after progress
resumed and stalled anew.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("turnkeep.watchdog")


class StallWatchdog:
    def __init__(self, stall_s: float, paused: Callable[[], bool], clock: Callable[[], float] = time.monotonic):
        self._stall_s = stall_s
        self._paused = paused
        self._clock = clock
        self._progress: tuple | None = None
        self._quiet_s = 0.0
        self._last_look: float | None = None
        self.warned = False

    def look(self, progress: tuple) -> float | None:
        """Note the progress counters; the quiet seconds when a warning is due now (once per stall), else None."""
        now = self._clock()
        if progress != self._progress:
            self._progress, self._quiet_s, self.warned = progress, 0.0, False
        elif self._last_look is not None and not self._paused():
            self._quiet_s += now - self._last_look
        self._last_look = now
        if self._quiet_s >= self._stall_s and not self.warned:
            self.warned = True
            return self._quiet_s
        return None


def stall_message(quiet_s: float, train_waits: str, rollout_waits: str, holders: dict[str, list[str]]) -> str:
    gates = ", ".join(f"{gate} [{', '.join(names)}]" for gate, names in holders.items())
    return (f"no train step and no committed turn for {quiet_s:.0f} s (snapshot pauses not counted): the train pump "
            f"waits on {train_waits}; the rollout pump waits on {rollout_waits}; gate holders: {gates}")


async def watch_for_stalls(controller, holders: Callable[[], dict[str, list[str]]], stall_s: float,
                           every_s: float, turn_commits: Callable[[], Awaitable[int | None]]) -> None:
    """Runs until cancelled; `turn_commits` is the environment servers' committed-turn count (None: not known)."""
    watchdog = StallWatchdog(stall_s, paused=lambda: bool(controller.deadline_holds.holders()))
    while True:
        await asyncio.sleep(every_s)
        commits = await turn_commits()
        quiet_s = watchdog.look((controller.training.step, commits))
        if quiet_s is not None:
            gates = {"admission": sorted(controller.admission.holders()),
                     "deadlines": sorted(controller.deadline_holds.holders()), **holders()}
            message = stall_message(quiet_s, controller.training.waiting_on, controller.rollouts.waiting_on(), gates)
            log.warning("%s", message)
            print(f"turnkeep: warning: {message}", file=sys.stderr, flush=True)


def env_turn_commits(env_client) -> Callable[[], Awaitable[int | None]]:
    async def count() -> int | None:
        try:
            health = await env_client.health()
        except Exception as err:  # counters unknown this time: the router's own warning names an absent server
            log.debug("no turn counters: %s", err)
            return None
        return int(health.get("turn_commits", 0))

    return count
