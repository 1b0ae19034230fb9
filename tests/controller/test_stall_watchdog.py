"""The stall watchdog: one warning after `stall_s` without a train step or a committed turn, naming what each
pump waits on; a snapshot pause (the deadline hold set held) stops its clock."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from turnkeep.controller.stall_watchdog import StallWatchdog, watch_for_stalls
from turnkeep.primitives.holds import HoldSet


def test_one_warning_per_stall_and_progress_starts_the_count_again():
    now, paused = [0.0], [False]
    dog = StallWatchdog(60, paused=lambda: paused[0], clock=lambda: now[0])
    warnings = []
    for t in range(0, 200, 10):
        now[0] = float(t)
        progress = (3, 100) if t < 100 else (4, 100)  # a train step at t=100
        if (quiet := dog.look(progress)) is not None:
            warnings.append((t, quiet))
    assert warnings == [(60, 60.0), (160, 60.0)]


def test_a_snapshot_pause_stops_the_clock_like_a_rollout_deadline():
    now, paused = [0.0], [False]
    dog = StallWatchdog(60, paused=lambda: paused[0], clock=lambda: now[0])
    for t in range(0, 400, 10):
        now[0] = float(t)
        paused[0] = 20 <= t < 320  # a five-minute pause; 20 s quiet before it, then 80 s after
        quiet = dog.look((3, 100))
        if t < 360:
            assert quiet is None, t
    assert dog.warned and quiet is None  # warned at t=360 (20 + 40 s of unpaused quiet), not again at 390


@pytest.mark.timeout(30)
def test_the_warning_names_what_each_pump_waits_on_and_the_gate_holders(capsys):
    admission, deadlines = HoldSet("admission"), HoldSet("deadlines")
    admission.add("refit")
    controller = SimpleNamespace(
        training=SimpleNamespace(step=7, waiting_on="finished groups for step 8: 1 of 4"),
        rollouts=SimpleNamespace(waiting_on=lambda: "admission, closed by refit (16 siblings wait)"),
        admission=admission, deadline_holds=deadlines,
    )

    async def no_turns() -> int:
        return 42

    async def scenario() -> None:
        task = asyncio.create_task(watch_for_stalls(controller, lambda: {"trainer": [], "policy_admission": ["refit"]},
                                                    stall_s=0.2, every_s=0.05, turn_commits=no_turns))
        await asyncio.sleep(1.0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("turnkeep: warning: no train step and no committed turn for 0 s")
    assert "the train pump waits on finished groups for step 8: 1 of 4" in line
    assert "the rollout pump waits on admission, closed by refit (16 siblings wait)" in line
    assert "gate holders: admission [refit], deadlines [], trainer [], policy_admission [refit]" in line
