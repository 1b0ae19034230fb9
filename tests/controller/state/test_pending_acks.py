"""The receipts whose ACK is in flight: a flush waits for them, and gives up after its bound."""

from __future__ import annotations

import asyncio
import time

from turnkeep.controller.state.pending_acks import PendingAcks


def test_drained_waits_until_the_last_ack_is_answered():
    async def scenario() -> tuple[list[str], float]:
        pending = PendingAcks()
        pending.add("r-1")
        pending.add("r-2")
        asyncio.get_running_loop().call_later(0.05, pending.done, "r-1")
        asyncio.get_running_loop().call_later(0.15, pending.done, "r-2")
        started = time.monotonic()
        left = await pending.drained(5.0)
        return left, time.monotonic() - started

    left, waited = asyncio.run(scenario())
    assert left == [] and 0.1 < waited < 2.0


def test_drained_names_what_is_still_in_flight_after_its_bound():
    async def scenario() -> list[str]:
        pending = PendingAcks()
        pending.add("r-late")
        pending.add("r-ok")
        pending.done("r-ok")
        return await pending.drained(0.05)

    assert asyncio.run(scenario()) == ["r-late"]


def test_an_empty_set_is_drained_at_once_and_done_is_idempotent():
    async def scenario() -> list[str]:
        pending = PendingAcks()
        pending.done("never-added")
        return await pending.drained(0.0)

    assert asyncio.run(scenario()) == []
