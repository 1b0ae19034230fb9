"""Hold sets: the one primitive behind every pause.

A hold set is a set of named holders. The thing it guards (admission, rollout
deadline clocks, the trainer's optimizer step) runs only while the set is empty.
Several reasons to pause can overlap (a weight refit and a snapshot), so a pause is
never a boolean: each reason is its own holder, and releasing one leaves the others.

Adding a holder that is already present is a no-op, so a retried activity never
leaks a hold. A holder may carry a lease; a lease that is not renewed in time
expires, so a coordinator that dies (or a Temporal workflow that is terminated and
runs no compensation) cannot stop training or generation for good.

A hold set lives in one asyncio event loop and is not thread-safe. Expiry is noticed
three ways: lazily by every public call, by a timer on the running loop (so
listeners hear about an expiry even if nobody calls anything), and by `wait_clear`,
which waits no longer than the next expiry.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("turnkeep.holds")

Clock = Callable[[], float]
ChangeListener = Callable[[bool], None]


class UnknownHolder(KeyError):
    """Raised when renewing a holder that is not (or no longer) in the set."""

    def __init__(self, hold_set: str, holder: str) -> None:
        # Both in args so the exception survives pickling (Ray and Temporal do that).
        super().__init__(hold_set, holder)
        self.hold_set = hold_set
        self.holder = holder

    def __str__(self) -> str:
        return (
            f"hold set {self.hold_set!r} has no holder {self.holder!r} "
            "(never added, released, or its lease expired)"
        )


@dataclass(frozen=True)
class HolderInfo:
    """One holder as reported by `HoldSet.snapshot()` (for status and metrics)."""

    name: str
    held_s: float
    """Seconds since the holder was added."""
    lease_remaining_s: float | None
    """Seconds until the lease expires; None for a holder without a lease."""


@dataclass
class _Holder:
    added_at: float
    expires_at: float | None


def _check_lease(lease_s: float | None) -> None:
    if lease_s is not None and not (lease_s > 0 and math.isfinite(lease_s)):
        raise ValueError(f"a lease must be a positive finite number of seconds, got {lease_s!r}")


class HoldSet:
    """A set of named holders; the guarded thing runs only while the set is empty."""

    def __init__(self, name: str = "holds", *, clock: Clock = time.monotonic) -> None:
        """Create an empty hold set; `name` only appears in logs and errors."""
        self.name = name
        self._clock = clock
        self._holders: dict[str, _Holder] = {}
        self._listeners: list[ChangeListener] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._held_since: float | None = None

    @property
    def clock(self) -> Clock:
        """The monotonic clock leases are measured with (shared with deadline registries)."""
        return self._clock

    def add(self, holder: str, lease_s: float | None = None) -> bool:
        """Add `holder`; return True if it was not already there.

        Adding an existing holder changes nothing except its lease: with `lease_s`
        the lease is (re)set to expire `lease_s` seconds from now.
        """
        _check_lease(lease_s)
        self._expire_due()
        now = self._clock()
        expires_at = None if lease_s is None else now + lease_s
        existing = self._holders.get(holder)
        if existing is not None:
            if expires_at is not None:
                existing.expires_at = expires_at
                self._schedule_expiry()
            return False
        was_clear = not self._holders
        self._holders[holder] = _Holder(added_at=now, expires_at=expires_at)
        self._schedule_expiry()
        if was_clear:
            self._held_since = now
            self._notify(False)
        return True

    def renew(self, holder: str, lease_s: float) -> None:
        """Set `holder`'s lease to expire `lease_s` seconds from now.

        Raises `UnknownHolder` if the holder is absent or its lease already ran
        out: a holder that lost its lease must add itself again, deliberately,
        rather than be revived by a late heartbeat.
        """
        _check_lease(lease_s)
        self._expire_due()
        entry = self._holders.get(holder)
        if entry is None:
            raise UnknownHolder(self.name, holder)
        entry.expires_at = self._clock() + lease_s
        self._schedule_expiry()

    def release(self, holder: str) -> bool:
        """Remove `holder`; return True if it was there (releasing twice is fine)."""
        self._expire_due()
        if self._holders.pop(holder, None) is None:
            return False
        if self._holders:
            self._schedule_expiry()
        else:
            self._became_clear()
        return True

    def holders(self) -> frozenset[str]:
        """Names of the current holders."""
        self._expire_due()
        return frozenset(self._holders)

    def is_clear(self) -> bool:
        """True when nobody holds the set, i.e. the guarded thing may run."""
        self._expire_due()
        return not self._holders

    def held_seconds(self) -> float:
        """Seconds the set has been continuously non-empty (0.0 while clear)."""
        self._expire_due()
        if self._held_since is None:
            return 0.0
        return max(0.0, self._clock() - self._held_since)

    def next_expiry_in(self) -> float | None:
        """Seconds until the earliest lease expires; None if no holder has a lease."""
        self._expire_due()
        earliest = self._earliest_expiry()
        if earliest is None:
            return None
        return max(0.0, earliest - self._clock())

    def snapshot(self) -> list[HolderInfo]:
        """Every holder with how long it has held and its remaining lease, sorted by name."""
        self._expire_due()
        now = self._clock()
        return [
            HolderInfo(
                name=name,
                held_s=max(0.0, now - h.added_at),
                lease_remaining_s=None if h.expires_at is None else max(0.0, h.expires_at - now),
            )
            for name, h in sorted(self._holders.items())
        ]

    def on_change(self, callback: ChangeListener) -> Callable[[], None]:
        """Call `callback(is_clear)` on every empty<->non-empty transition.

        Returns a function that unsubscribes the callback. Callbacks run
        synchronously inside the call that caused the transition (or the expiry
        timer), so they must be quick and must not block.
        """
        self._listeners.append(callback)

        def unsubscribe() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return unsubscribe

    async def wait_clear(self) -> None:
        """Return once the set is empty (immediately if it already is).

        Returns by itself when the last holder's lease runs out, even if no one
        else calls into the set meanwhile.
        """
        loop = asyncio.get_running_loop()
        while True:
            self._expire_due()
            if not self._holders:
                return
            # A holder added outside a running loop has no expiry timer yet.
            self._schedule_expiry()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait({waiter}, timeout=self._timeout_until_expiry())
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def __repr__(self) -> str:
        return f"HoldSet({self.name!r}, holders={sorted(self._holders)!r})"

    # -- internals ------------------------------------------------------------------

    def _earliest_expiry(self) -> float | None:
        leases = [h.expires_at for h in self._holders.values() if h.expires_at is not None]
        return min(leases) if leases else None

    def _timeout_until_expiry(self) -> float | None:
        earliest = self._earliest_expiry()
        return None if earliest is None else max(0.0, earliest - self._clock())

    def _expire_due(self) -> None:
        if not self._holders:
            return
        now = self._clock()
        expired = [
            (name, h)
            for name, h in self._holders.items()
            if h.expires_at is not None and h.expires_at <= now
        ]
        if not expired:
            return
        for name, h in expired:
            del self._holders[name]
            # A lease running out means its owner died or stalled: worth a warning,
            # because until now it was pausing training or generation.
            logger.warning(
                "hold set %r: lease of holder %r expired (held %.1fs, %.3fs past its lease); "
                "releasing it",
                self.name,
                name,
                now - h.added_at,
                now - (h.expires_at or now),
            )
        if self._holders:
            self._schedule_expiry()
        else:
            self._became_clear()

    def _became_clear(self) -> None:
        self._held_since = None
        self._cancel_timer()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._notify(True)

    def _notify(self, is_clear: bool) -> None:
        for callback in list(self._listeners):
            try:
                callback(is_clear)
            except Exception:
                # One broken listener must not leave the set or the other listeners
                # in a half-updated state.
                logger.exception("hold set %r: change listener %r failed", self.name, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule_expiry(self) -> None:
        self._cancel_timer()
        earliest = self._earliest_expiry()
        if earliest is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # No loop (synchronous use, tests with a fake clock): the lazy checks in
            # every call and in wait_clear still notice the expiry.
            return
        delay = max(0.0, earliest - self._clock())
        self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        # With a fake clock the timer can fire before the lease is due; _expire_due
        # then simply schedules the next check.
        self._expire_due()
        if self._timer is None and self._holders:
            self._schedule_expiry()
