"""A trainer checkpoint announced before the run workflow connects reaches nobody; once it connects, every one
reaches it, in order."""

from __future__ import annotations

import asyncio

from turnkeep.controller.checkpoint_announcements import CheckpointAnnouncements


def test_announcements_reach_the_listener_only_once_it_is_connected() -> None:
    heard: list[tuple[int, str, bool]] = []

    async def listener(step: int, trigger: str, repeat: bool) -> None:
        heard.append((step, trigger, repeat))

    async def scenario() -> None:
        announcements = CheckpointAnnouncements()
        await announcements.announce(1, "period", False)  # before the run workflow runs: dropped
        announcements.connect(listener)
        await announcements.announce(2, "period", False)
        await announcements.announce(2, "period", True)

    asyncio.run(scenario())
    assert heard == [(2, "period", False), (2, "period", True)]
