"""Pausable deadlines: rollout budgets whose clocks stop while a hold set is held.

A rollout's budget measures the time it spends running, not the time it spends
parked by a snapshot or waiting out a colocated train switch (invariant 5: a
rollout's deadline never runs while the rollout is parked). A `DeadlineRegistry`
ties every deadline it creates to one `HoldSet`: while the set has holders
(`snapshot:<id>`, `colocated-train-switch`) all its clocks are paused, and a rollout
parked longer than its whole budget is not timed out. Because the pause follows the
hold set's empty/non-empty transitions, releasing one of two overlapping holders
does not restart the clocks.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from turnkeep.primitives.holds import HoldSet

Clock = Callable[[], float]
T = TypeVar("T")


class DeadlineExpired(TimeoutError):
    """A deadline's running (unpaused) time exceeded its budget.

    Subclasses `TimeoutError`, which is `asyncio.TimeoutError` on Python 3.11, so
    code that already handles timeouts handles this too.
    """

    def __init__(self, key: str, budget_s: float, elapsed_s: float | None = None) -> None:
        # Every field in args so the exception survives pickling (Ray and Temporal do that).
        super().__init__(key, budget_s, elapsed_s)
        self.key = key
        self.budget_s = budget_s
        self.elapsed_s = elapsed_s

    def __str__(self) -> str:
        spent = "" if self.elapsed_s is None else f" after {self.elapsed_s:.3f}s of running time"
        return f"deadline {self.key!r} expired: budget {self.budget_s:.3f}s{spent}"


class PausableDeadline:
    """A time budget that only counts down while it is not paused."""

    def __init__(self, budget_s: float, *, clock: Clock = time.monotonic, paused: bool = False) -> None:
        """Start a deadline of `budget_s` seconds (math.inf for none), running unless `paused`."""
        if math.isnan(budget_s) or budget_s < 0:
            raise ValueError(f"budget_s must be >= 0, got {budget_s!r}")
        self.budget_s = budget_s
        self._clock = clock
        self._spent = 0.0
        self._running_since: float | None = None if paused else clock()

    @property
    def paused(self) -> bool:
        """True while the clock is stopped."""
        return self._running_since is None

    def pause(self) -> None:
        """Stop the clock (no-op if already paused)."""
        if self._running_since is not None:
            self._spent += max(0.0, self._clock() - self._running_since)
            self._running_since = None

    def resume(self) -> None:
        """Restart the clock (no-op if already running)."""
        if self._running_since is None:
            self._running_since = self._clock()

    def elapsed(self) -> float:
        """Running time spent so far, excluding paused stretches."""
        if self._running_since is None:
            return self._spent
        return self._spent + max(0.0, self._clock() - self._running_since)

    def remaining(self) -> float:
        """Running time left before the deadline expires (never negative)."""
        return max(0.0, self.budget_s - self.elapsed())

    def expired(self) -> bool:
        """True once the running time reached the budget."""
        return self.elapsed() >= self.budget_s

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running"
        return f"PausableDeadline(budget_s={self.budget_s}, elapsed={self.elapsed():.3f}, {state})"


class DeadlineRegistry:
    """Deadlines whose clocks run only while one hold set is clear."""

    def __init__(self, hold_set: HoldSet, *, clock: Clock | None = None) -> None:
        """Follow `hold_set`; deadlines use its clock unless `clock` is given."""
        self._hold_set = hold_set
        self._clock = clock or hold_set.clock
        self._deadlines: dict[str, PausableDeadline] = {}
        self._change_waiters: set[asyncio.Future[None]] = set()
        self._unsubscribe = hold_set.on_change(self._on_hold_change)

    @property
    def hold_set(self) -> HoldSet:
        """The hold set whose holders pause every deadline here."""
        return self._hold_set

    def register(self, key: str, budget_s: float) -> PausableDeadline:
        """Create the deadline `key`; it starts paused if the hold set is held."""
        if key in self._deadlines:
            # Two rollouts sharing a key would share (and corrupt) one budget.
            raise ValueError(f"deadline {key!r} is already registered")
        deadline = PausableDeadline(budget_s, clock=self._clock, paused=not self._hold_set.is_clear())
        self._deadlines[key] = deadline
        return deadline

    def unregister(self, key: str) -> bool:
        """Forget the deadline `key`; return True if it was registered."""
        return self._deadlines.pop(key, None) is not None

    def get(self, key: str) -> PausableDeadline | None:
        """The deadline registered under `key`, if any."""
        return self._deadlines.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._deadlines

    def __len__(self) -> int:
        return len(self._deadlines)

    def status(self) -> dict[str, float]:
        """Remaining running seconds of every registered deadline, by key."""
        return {key: d.remaining() for key, d in sorted(self._deadlines.items())}

    def close(self) -> None:
        """Stop following the hold set (deadlines keep their current state)."""
        self._unsubscribe()

    async def run_with_deadline(self, key: str, budget_s: float, coro: Awaitable[T]) -> T:
        """Run `coro` under the deadline `key`; cancel it and raise `DeadlineExpired` on expiry.

        Only unpaused time counts, so the rollout is never timed out while the
        hold set has holders, however long they stay. If `coro` finishes in the
        same instant the budget runs out, its result wins: the work is done.
        """
        deadline = self.register(key, budget_s)
        task = asyncio.ensure_future(coro)
        try:
            while True:
                if task.done():
                    return task.result()
                if deadline.expired():
                    raise DeadlineExpired(key, budget_s, deadline.elapsed())
                changed = self._change_future()
                if deadline.paused:
                    # Bounded by the hold set's next lease expiry so an expiry that
                    # nobody else observes still resumes the clock.
                    timeout = self._hold_set.next_expiry_in()
                else:
                    timeout = deadline.remaining()
                try:
                    await asyncio.wait(
                        {task, changed},
                        timeout=None if timeout is None or math.isinf(timeout) else timeout,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    self._change_waiters.discard(changed)
                # Lets a lazily noticed lease expiry fire on_change and resume clocks.
                self._hold_set.is_clear()
        finally:
            self.unregister(key)
            if not task.done():
                task.cancel()
                # Wait for the rollout to unwind so nothing keeps running past its deadline.
                await asyncio.gather(task, return_exceptions=True)

    # -- internals ------------------------------------------------------------------

    def _change_future(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._change_waiters.add(future)
        return future

    def _on_hold_change(self, is_clear: bool) -> None:
        for deadline in self._deadlines.values():
            if is_clear:
                deadline.resume()
            else:
                deadline.pause()
        waiters, self._change_waiters = self._change_waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
