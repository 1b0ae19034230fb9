"""The trainer's and the policy server's holders reach the audit log as hold_changed, and the checker's
lease check sees a stuck one (the samplers are stand-ins for the Ray actors' `*_leases` calls)."""

from __future__ import annotations

import asyncio

from turnkeep.chaos.invariants.holds import hold_spans, holds_within_lease
from turnkeep.controller.remote_holds import RemoteHoldWatch, diff
from turnkeep.schemas.audit import HoldChanged, RunStarted, StepTrained


def test_diff_reports_taken_renewed_and_released_but_not_a_lease_counting_down():
    changes, seen = diff({}, [("snap:1", 30.0), ("refit", None)], now=100.0)
    assert [(c.change, c.holder, c.lease_s) for c in changes] == [("taken", "snap:1", 30.0), ("taken", "refit", None)]
    changes, seen = diff(seen, [("snap:1", 28.0), ("refit", None)], now=102.0)  # same lease end: nothing
    assert changes == []
    changes, seen = diff(seen, [("snap:1", 30.0)], now=104.0)  # lease end moved 4 s later: renewed
    assert [(c.change, c.holder) for c in changes] == [("renewed", "snap:1"), ("released", "refit")]
    assert seen == {"snap:1": 134.0}


class Remote:
    def __init__(self) -> None:
        self.holders: list[tuple[str, float | None]] = []
        self.dead = False

    async def leases(self) -> list[tuple[str, float | None]]:
        if self.dead:
            raise RuntimeError("actor died")
        return list(self.holders)


def _watch(remote: Remote, clock: list[float]) -> tuple[RemoteHoldWatch, list[HoldChanged]]:
    events: list[HoldChanged] = []

    def emit(change, holder, holds, lease_s=None) -> None:
        events.append(HoldChanged(inc=1, t=clock[0], change=change, holder=holder, holds=holds, lease_s=lease_s))

    return RemoteHoldWatch({"trainer": remote.leases}, emit, clock=lambda: clock[0]), events


def test_a_trainer_holder_never_released_past_its_lease_fails_the_check_while_the_run_lives():
    remote, clock = Remote(), [1000.0]
    watch, events = _watch(remote, clock)
    remote.holders = [("snapshot:run:3:1", 5.0)]
    asyncio.run(watch.sample())
    # The holder stays and is never renewed; the run goes on training for a minute.
    clock[0] += 60
    asyncio.run(watch.sample())
    log = [RunStarted(inc=1, t=999.0, run_id="r", pid=1, resumed=False), *events,
           StepTrained(inc=1, t=1060.0, step=4, policy_version=4, group_ids=[])]
    result = holds_within_lease(log, hold_spans(log))
    assert not result.ok and "snapshot:run:3:1 (trainer) never released" in result.violations[0]


def test_a_trainer_holder_released_in_time_passes_and_a_dead_process_is_skipped():
    remote, clock = Remote(), [1000.0]
    watch, events = _watch(remote, clock)
    remote.holders = [("snapshot:run:3:1", 5.0)]
    asyncio.run(watch.sample())
    clock[0] += 2
    remote.holders = []
    asyncio.run(watch.sample())
    remote.dead = True
    clock[0] += 58
    asyncio.run(watch.sample())  # logged once, nothing emitted
    assert [e.change for e in events] == ["taken", "released"]
    log = [RunStarted(inc=1, t=999.0, run_id="r", pid=1, resumed=False), *events,
           StepTrained(inc=1, t=1060.0, step=4, policy_version=4, group_ids=[])]
    assert holds_within_lease(log, hold_spans(log)).ok


def test_a_process_that_does_not_answer_is_skipped_within_the_sample_timeout(monkeypatch):
    import turnkeep.controller.remote_holds as remote_holds

    monkeypatch.setattr(remote_holds, "SAMPLE_TIMEOUT_S", 0.05)

    async def hung() -> list[tuple[str, float | None]]:
        await asyncio.sleep(3600)
        return []

    events: list = []
    watch = RemoteHoldWatch({"trainer": hung}, lambda *a: events.append(a))
    asyncio.run(asyncio.wait_for(watch.sample(), 2.0))
    assert events == []
