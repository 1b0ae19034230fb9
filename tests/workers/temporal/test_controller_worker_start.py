"""The recovery runs while the trainer's and the engines' workers start: their failure ends it at once with their
error, and their being slower does not hold it back."""

from __future__ import annotations

import asyncio

import pytest

from workers.temporal.controller_worker import _unless_it_fails


def test_workers_that_fail_to_start_cancel_the_recovery_and_their_error_is_raised() -> None:
    async def scenario() -> asyncio.Task:
        async def workers() -> None:
            await asyncio.sleep(0.01)
            raise RuntimeError("the trainer's worker could not connect")

        recovery = asyncio.ensure_future(asyncio.sleep(3600))
        with pytest.raises(RuntimeError, match="could not connect"):
            await _unless_it_fails(asyncio.ensure_future(workers()), recovery)
        return recovery

    assert asyncio.run(scenario()).cancelled()


def test_the_recovery_returns_while_the_workers_are_still_starting() -> None:
    async def scenario() -> tuple[str, bool]:
        workers = asyncio.ensure_future(asyncio.sleep(3600))

        async def recovery() -> str:
            return "restored"

        result = await _unless_it_fails(workers, recovery())
        still_starting = not workers.done()
        workers.cancel()
        return result, still_starting

    assert asyncio.run(scenario()) == ("restored", True)
