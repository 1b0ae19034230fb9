"""Hold sets: holder identity, idempotence, leases and change notifications."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from turnkeep.primitives.holds import HoldSet, UnknownHolder


class FakeClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_releasing_one_of_two_holders_keeps_the_set_held() -> None:
    holds = HoldSet("admission")
    holds.add("refit")
    holds.add("snapshot:ckpt-1")
    assert holds.release("refit") is True
    assert not holds.is_clear()
    assert holds.holders() == frozenset({"snapshot:ckpt-1"})
    holds.release("snapshot:ckpt-1")
    assert holds.is_clear()


def test_retried_add_never_leaks_a_hold() -> None:
    holds = HoldSet()
    assert holds.add("snapshot:ckpt-1") is True
    assert holds.add("snapshot:ckpt-1") is False
    holds.release("snapshot:ckpt-1")
    assert holds.is_clear()
    assert holds.release("snapshot:ckpt-1") is False


def test_lease_expires_on_a_fake_clock_and_logs_the_holder(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    holds = HoldSet("trainer", clock=clock)
    holds.add("snapshot:ckpt-1", lease_s=10)
    holds.add("refit")
    clock.advance(9.9)
    assert "snapshot:ckpt-1" in holds.holders()
    clock.advance(0.2)
    with caplog.at_level(logging.WARNING, logger="turnkeep.holds"):
        assert holds.holders() == frozenset({"refit"})
    assert any("snapshot:ckpt-1" in r.getMessage() for r in caplog.records)


def test_renew_extends_the_lease() -> None:
    clock = FakeClock()
    holds = HoldSet(clock=clock)
    holds.add("snapshot:a", lease_s=5)
    clock.advance(4)
    holds.renew("snapshot:a", 5)
    clock.advance(4)
    assert not holds.is_clear()
    [info] = holds.snapshot()
    assert info.name == "snapshot:a"
    assert info.lease_remaining_s == pytest.approx(1.0)
    assert info.held_s == pytest.approx(8.0)
    clock.advance(1.5)
    assert holds.is_clear()


def test_re_adding_with_a_lease_renews_it() -> None:
    clock = FakeClock()
    holds = HoldSet(clock=clock)
    holds.add("snapshot:a", lease_s=5)
    clock.advance(4)
    assert holds.add("snapshot:a", lease_s=5) is False
    clock.advance(4)
    assert not holds.is_clear()


def test_renew_of_unknown_or_expired_holder_raises() -> None:
    clock = FakeClock()
    holds = HoldSet("deadlines", clock=clock)
    with pytest.raises(UnknownHolder, match="never-added"):
        holds.renew("never-added", 1)
    holds.add("snapshot:a", lease_s=1)
    clock.advance(2)
    with pytest.raises(KeyError):
        holds.renew("snapshot:a", 1)


def test_invalid_lease_is_refused() -> None:
    holds = HoldSet()
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            holds.add("x", lease_s=bad)
    assert holds.is_clear()


def test_on_change_fires_exactly_on_transitions() -> None:
    clock = FakeClock()
    holds = HoldSet(clock=clock)
    seen: list[bool] = []
    unsubscribe = holds.on_change(seen.append)
    holds.add("refit")
    holds.add("snapshot:a", lease_s=1)
    holds.add("refit")
    holds.release("refit")
    assert seen == [False]
    clock.advance(2)
    holds.is_clear()
    assert seen == [False, True]
    holds.release("snapshot:a")
    holds.add("colocated-train-switch")
    assert seen == [False, True, False]
    unsubscribe()
    holds.release("colocated-train-switch")
    assert seen == [False, True, False]


def test_a_failing_listener_does_not_break_the_set() -> None:
    holds = HoldSet()
    seen: list[bool] = []

    def broken(_: bool) -> None:
        raise RuntimeError("boom")

    holds.on_change(broken)
    holds.on_change(seen.append)
    holds.add("refit")
    holds.release("refit")
    assert seen == [False, True]
    assert holds.is_clear()


def test_held_seconds_counts_the_current_stretch() -> None:
    clock = FakeClock()
    holds = HoldSet(clock=clock)
    assert holds.held_seconds() == 0.0
    holds.add("a")
    clock.advance(3)
    holds.add("b")
    holds.release("a")
    clock.advance(2)
    assert holds.held_seconds() == pytest.approx(5.0)
    holds.release("b")
    assert holds.held_seconds() == 0.0


def test_wait_clear_returns_immediately_when_clear() -> None:
    async def main() -> None:
        await asyncio.wait_for(HoldSet().wait_clear(), timeout=1)

    asyncio.run(main())


def test_wait_clear_returns_on_release() -> None:
    async def main() -> None:
        holds = HoldSet()
        holds.add("refit")
        holds.add("snapshot:a")
        waiter = asyncio.create_task(holds.wait_clear())
        await asyncio.sleep(0.01)
        holds.release("refit")
        await asyncio.sleep(0.01)
        assert not waiter.done()
        holds.release("snapshot:a")
        await asyncio.wait_for(waiter, timeout=1)

    asyncio.run(main())


def test_wait_clear_returns_by_itself_when_a_real_lease_expires() -> None:
    async def main() -> float:
        holds = HoldSet()
        holds.add("snapshot:dead-coordinator", lease_s=0.05)
        start = time.monotonic()
        await asyncio.wait_for(holds.wait_clear(), timeout=2)
        return time.monotonic() - start

    waited = asyncio.run(main())
    assert 0.04 <= waited < 1.5


def test_wait_clear_notices_a_lease_taken_outside_the_loop() -> None:
    # No running loop at add() time means no expiry timer; wait_clear must still return.
    holds = HoldSet()
    holds.add("snapshot:a", lease_s=0.05)
    asyncio.run(asyncio.wait_for(holds.wait_clear(), timeout=2))
    assert holds.is_clear()


def test_listeners_hear_a_lease_expiry_without_any_call() -> None:
    async def main() -> list[bool]:
        holds = HoldSet()
        seen: list[bool] = []
        holds.on_change(seen.append)
        holds.add("snapshot:a", lease_s=0.05)
        await asyncio.sleep(0.3)
        return seen

    assert asyncio.run(main()) == [False, True]
