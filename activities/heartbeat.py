"""Heartbeats while a long activity awaits something slow, so a cancel reaches it promptly
and a dead worker shows as a heartbeat timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from temporalio import activity

HEARTBEAT_S = 1.0


@contextmanager
def heartbeating(detail: str) -> Iterator[None]:
    async def beat() -> None:
        while True:
            activity.heartbeat(detail)
            await asyncio.sleep(HEARTBEAT_S)

    task = asyncio.get_running_loop().create_task(beat())
    try:
        yield
    finally:
        task.cancel()
