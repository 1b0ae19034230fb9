"""A heartbeat file says how long ago its process's event loop last beat; a process that stops beating (frozen,
its loop blocked) ages it, which is how a watcher tells a hang from a death."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from turnkeep.primitives.heartbeat import beat, beat_file, beat_forever, silent_for


def test_a_beat_is_fresh_and_ages_until_the_next(tmp_path: Path) -> None:
    path = beat_file(tmp_path, "controller")
    assert silent_for(path) is None  # no beat yet: no verdict
    beat(path)  # makes the pids folder
    assert silent_for(path) < 0.5
    time.sleep(0.3)
    assert 0.25 <= silent_for(path) < 1.0
    path.write_bytes(b"torn")
    assert silent_for(path) is None


def test_the_loop_beats_while_it_runs_and_the_beat_ages_once_it_stops(tmp_path: Path) -> None:
    path = beat_file(tmp_path, "controller")

    async def scenario() -> None:
        task = asyncio.create_task(beat_forever(path, every_s=0.05))
        await asyncio.sleep(0.3)
        assert silent_for(path) < 0.2
        time.sleep(0.4)  # the loop blocked: no beat meanwhile
        assert silent_for(path) >= 0.35
        await asyncio.sleep(0.1)
        assert silent_for(path) < 0.2  # beating again
        task.cancel()

    asyncio.run(scenario())
