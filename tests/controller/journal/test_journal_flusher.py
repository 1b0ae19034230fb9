"""Records no writer waits on (an admission, a train step) reach the disk within the flush interval anyway."""

from __future__ import annotations

import asyncio
import logging

from turnkeep.controller.journal.journal_flusher import flush_journal_forever
from turnkeep.controller.journal.records import CURSOR, TRAINED
from turnkeep.controller.journal.state_journal import StateJournal
from turnkeep.primitives.segment_format import LogPosition
from turnkeep.primitives.segment_reader import read_records_to_end

START = LogPosition(seq=0, chain="00" * 32)


def on_disk(journal: StateJournal) -> int:
    return sum(1 for _ in read_records_to_end(journal.directory, journal.log_id, START))


async def _until(predicate, timeout_s: float = 5.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def test_records_nobody_waits_on_reach_the_disk_within_the_interval(tmp_path):
    async def main() -> None:
        journal = StateJournal(tmp_path, "run-test", 1, {})
        journal.record(CURSOR, {"next_index": 7})
        journal.record(TRAINED, {"step": 1, "policy_version": 1, "groups": ["g0000000"]})
        await asyncio.sleep(0.1)
        assert on_disk(journal) == 0  # buffered: without the flusher nothing writes them
        flusher = asyncio.create_task(flush_journal_forever(lambda: journal, interval_s=0.01))
        assert await _until(lambda: on_disk(journal) == 2)
        journal.record(CURSOR, {"next_index": 8})
        assert await _until(lambda: on_disk(journal) == 3)
        flusher.cancel()
        journal.close()

    asyncio.run(main())


def test_a_journal_started_by_a_restore_is_the_one_flushed(tmp_path):
    async def main() -> None:
        first = StateJournal(tmp_path, "run-test", 1, {})
        current = {"journal": first}
        flusher = asyncio.create_task(flush_journal_forever(lambda: current["journal"], interval_s=0.01))
        second = StateJournal(tmp_path, "run-test", 2, {})
        current["journal"] = second
        first.close()
        second.record(CURSOR, {"next_index": 3})
        assert await _until(lambda: on_disk(second) == 1)
        flusher.cancel()
        second.close()

    asyncio.run(main())


class FailingTwice:
    def __init__(self) -> None:
        self.calls = 0

    async def flush_pending(self) -> None:
        self.calls += 1
        if self.calls <= 2:
            raise OSError(28, "No space left on device")


def test_a_failing_flush_is_reported_once_and_tried_again(caplog):
    hooks = FailingTwice()

    async def main() -> None:
        flusher = asyncio.create_task(flush_journal_forever(lambda: hooks, interval_s=0.005))
        assert await _until(lambda: hooks.calls >= 4)
        flusher.cancel()

    with caplog.at_level(logging.INFO, logger="turnkeep.journal"):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "No space left on device" in warnings[0], warnings
    assert any("written again" in r.getMessage() for r in caplog.records)
