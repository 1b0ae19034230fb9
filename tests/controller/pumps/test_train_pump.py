"""The train pump's checkpoint requests: none is dropped, whatever it races."""

from __future__ import annotations

import asyncio

from controller.pumps.train_pump import TrainPump


def _pump(written: list, announced: list) -> TrainPump:
    async def write(step: int, trigger: str) -> None:
        written.append((step, trigger))

    async def announce(step: int, trigger: str, repeat: bool) -> None:
        announced.append((step, trigger, repeat))
        assert pump.checkpointed_step == step  # recorded before the attempt it starts can ask for the anchor

    # Serving a request touches only the checkpoint callbacks; the rest is never reached.
    pump = TrainPump(None, None, None, None, None, None, None, None, on_groups_finished=lambda: None,
                     write_checkpoint=write, announce_checkpoint=announce, on_step=lambda report: None)
    return pump


def test_a_request_at_an_unsaved_step_writes_a_checkpoint_under_its_trigger():
    written, announced = [], []
    pump = _pump(written, announced)
    pump.step = 7
    pump.request_checkpoint("preemption")
    asyncio.run(pump._serve_checkpoint_request())
    assert written == [(7, "preemption")] and announced == [(7, "preemption", False)]
    assert pump.has_checkpoint_of_current_step()


def test_a_request_that_raced_a_checkpoint_of_the_same_step_is_announced_again():
    written, announced = [], []
    pump = _pump(written, announced)
    pump.restore(12, policy_version=12)  # step 12 is checkpointed already, as after a save_period checkpoint
    pump.request_checkpoint("preemption")
    asyncio.run(pump._serve_checkpoint_request())
    assert written == [] and announced == [(12, "preemption", True)]
    asyncio.run(pump._serve_checkpoint_request())
    assert announced == [(12, "preemption", True)]  # served once


def test_a_frozen_pump_starts_no_step_but_still_writes_a_requested_checkpoint():
    written, announced = [], []
    pump = _pump(written, announced)
    pump.step = 9

    async def scenario():
        pump.freeze()
        claim = asyncio.create_task(pump._claim_batch())  # a step would start once it returned groups
        await asyncio.sleep(0.05)
        pump.request_checkpoint("preemption")
        await asyncio.sleep(0.05)
        pump.group_settled("g1", True)  # a group that completes meanwhile starts nothing either
        await asyncio.sleep(0.05)
        still_waiting = not claim.done()
        claim.cancel()
        return still_waiting

    assert asyncio.run(scenario())
    assert written == [(9, "preemption")] and announced == [(9, "preemption", False)]
