"""Pausable deadlines: held time never counts against a rollout's budget."""

from __future__ import annotations

import asyncio

import pytest

from turnkeep.primitives.deadlines import DeadlineExpired, DeadlineRegistry, PausableDeadline
from turnkeep.primitives.holds import HoldSet


class FakeClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_paused_time_does_not_count() -> None:
    clock = FakeClock()
    deadline = PausableDeadline(10, clock=clock)
    clock.advance(3)
    deadline.pause()
    deadline.pause()
    clock.advance(100)
    assert deadline.elapsed() == pytest.approx(3)
    deadline.resume()
    deadline.resume()
    clock.advance(2)
    assert deadline.elapsed() == pytest.approx(5)
    assert deadline.remaining() == pytest.approx(5)
    assert not deadline.expired()
    clock.advance(5)
    assert deadline.expired()
    assert deadline.remaining() == 0.0


def test_registry_pauses_while_held_and_new_deadlines_start_paused() -> None:
    clock = FakeClock()
    holds = HoldSet("deadlines", clock=clock)
    registry = DeadlineRegistry(holds)
    running = registry.register("r1", 10)
    clock.advance(2)
    holds.add("snapshot:c1")
    late = registry.register("r2", 10)
    assert running.paused and late.paused
    clock.advance(60)
    holds.release("snapshot:c1")
    clock.advance(1)
    assert running.elapsed() == pytest.approx(3)
    assert late.elapsed() == pytest.approx(1)
    assert registry.status() == {"r1": pytest.approx(7), "r2": pytest.approx(9)}
    with pytest.raises(ValueError):
        registry.register("r1", 5)
    assert registry.unregister("r1") is True
    assert registry.unregister("r1") is False


def test_releasing_one_of_two_overlapping_holders_does_not_restart_the_clock() -> None:
    clock = FakeClock()
    holds = HoldSet("deadlines", clock=clock)
    registry = DeadlineRegistry(holds)
    deadline = registry.register("r1", 10)
    holds.add("snapshot:c1")
    holds.add("colocated-train-switch")
    clock.advance(30)
    holds.release("snapshot:c1")
    clock.advance(30)
    assert deadline.paused
    assert deadline.elapsed() == 0.0
    holds.release("colocated-train-switch")
    clock.advance(4)
    assert deadline.elapsed() == pytest.approx(4)


def test_a_rollout_held_longer_than_its_budget_is_not_timed_out() -> None:
    async def main() -> str:
        holds = HoldSet("deadlines")
        registry = DeadlineRegistry(holds)
        parked_then_done = asyncio.Event()

        async def rollout() -> str:
            await parked_then_done.wait()
            return "finished"

        run = asyncio.create_task(registry.run_with_deadline("g.0.0", 0.1, rollout()))
        holds.add("snapshot:c1")
        await asyncio.sleep(0.35)  # parked for 3.5x the whole budget
        assert not run.done()
        holds.release("snapshot:c1")
        parked_then_done.set()
        return await asyncio.wait_for(run, timeout=2)

    assert asyncio.run(main()) == "finished"


def test_an_unheld_rollout_over_budget_raises_and_is_cancelled() -> None:
    async def main() -> None:
        registry = DeadlineRegistry(HoldSet("deadlines"))
        cancelled = asyncio.Event()

        async def rollout() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        with pytest.raises(DeadlineExpired) as info:
            await asyncio.wait_for(registry.run_with_deadline("g.1.0", 0.05, rollout()), timeout=2)
        assert info.value.key == "g.1.0" and info.value.budget_s == 0.05
        assert isinstance(info.value, asyncio.TimeoutError)
        assert cancelled.is_set()
        assert "g.1.0" not in registry

    asyncio.run(main())


def test_a_dead_holders_lease_lets_the_clock_run_again() -> None:
    async def main() -> DeadlineExpired:
        holds = HoldSet("deadlines")
        registry = DeadlineRegistry(holds)
        holds.add("snapshot:dead", lease_s=0.1)
        with pytest.raises(DeadlineExpired) as info:
            await asyncio.wait_for(registry.run_with_deadline("g.2.0", 0.05, asyncio.sleep(10)), timeout=2)
        return info.value

    expired = asyncio.run(main())
    assert expired.elapsed_s is not None and expired.elapsed_s >= 0.05


def test_rollout_errors_propagate_and_unregister() -> None:
    async def main() -> None:
        registry = DeadlineRegistry(HoldSet())

        async def rollout() -> None:
            raise RuntimeError("tool crashed")

        with pytest.raises(RuntimeError, match="tool crashed"):
            await registry.run_with_deadline("g.3.0", 1.0, rollout())
        assert len(registry) == 0

    asyncio.run(main())
