"""`Controller.run` with stand-in pumps: a pump that fails stops the run with one line, and the other pump is
cancelled rather than waited for (the train pump would wait for rows for good)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from turnkeep.controller.errors import RunStopped
from turnkeep.controller.journal.state_journal import NO_JOURNAL
from turnkeep.controller.runtime import Controller


class NoEvaluations:
    async def run(self) -> None:
        await asyncio.Event().wait()

    def before_training(self, step: int) -> None:
        pass


class FailingRollouts:
    async def run(self) -> None:
        await asyncio.sleep(0.05)
        raise RuntimeError("a rollout sibling task crashed; see the log above")


class WaitingTraining:
    step = 0

    def __init__(self) -> None:
        self.cancelled = False

    async def run(self, max_steps) -> None:
        try:
            await asyncio.sleep(3600)  # waits for rows that never come
        except asyncio.CancelledError:
            self.cancelled = True
            raise


@pytest.mark.timeout(30)
def test_a_failed_rollout_pump_stops_the_run_in_one_line_and_cancels_training():
    training = WaitingTraining()
    stand_in = SimpleNamespace(rollouts=FailingRollouts(), training=training,
                               data_plane=SimpleNamespace(journal=NO_JOURNAL), evaluations=NoEvaluations())

    async def scenario() -> None:
        stand_in._stop_requested = asyncio.Event()
        await Controller.run(stand_in, 10)

    with pytest.raises(RunStopped) as raised:
        asyncio.run(scenario())
    message = str(raised.value)
    assert "\n" not in message and training.cancelled
    assert message.startswith("the rollout-pump failed: RuntimeError: a rollout sibling task crashed")
    assert message.endswith("run the same command again (same --run-dir) once the cause is fixed")
