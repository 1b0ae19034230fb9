"""The audit log: typed lines, flushed in batches, shared by two writers, a torn tail skipped."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time

import orjson
import pytest

from turnkeep.primitives.atomic_files import DamagedJsonl
from turnkeep.primitives.audit_log import AUDIT_FILE, AuditLog, read_audit, segments_digest
from turnkeep.schemas.audit import GroupAdmitted, StepTrained, TurnCommitted
from turnkeep.schemas.rollout import Segment


def test_two_writers_share_one_file_and_a_torn_tail_is_skipped(tmp_path) -> None:
    controller, env = AuditLog(tmp_path / AUDIT_FILE, 2), AuditLog(tmp_path / AUDIT_FILE, 2)
    controller.emit(GroupAdmitted, group_id="g1", size=2)
    env.emit(TurnCommitted, rollout_id="g1.0.0", group_id="g1", sibling=0, attempt=0, turn=1, policy_version=3,
             tokens=5)
    assert list(read_audit(tmp_path)) == []  # nothing is written before a flush
    env.flush()
    controller.flush()
    with open(tmp_path / AUDIT_FILE, "ab") as f:
        f.write(b'{"t": 1, "inc": 2, "event": "step_tr')  # a crash in the middle of a line
    events = list(read_audit(tmp_path))
    assert [e.event for e in events] == ["turn_committed", "group_admitted"]
    assert all(e.inc == 2 for e in events)


def test_the_background_task_flushes_and_close_writes_the_rest(tmp_path) -> None:
    async def scenario() -> None:
        log = AuditLog(tmp_path / AUDIT_FILE, 1, flush_interval_s=0.01)
        log.start()
        log.emit(GroupAdmitted, group_id="g1", size=2)
        await asyncio.sleep(0.1)
        assert [e.event for e in read_audit(tmp_path)] == ["group_admitted"]
        log.emit(StepTrained, step=1, policy_version=1, group_ids=["g1"])
        await log.close()

    asyncio.run(scenario())
    assert [e.event for e in read_audit(tmp_path)] == ["group_admitted", "step_trained"]


def test_the_segments_digest_ignores_logprobs_but_not_tokens_or_versions() -> None:
    base = [Segment(kind="prompt", token_ids=[1, 2]), Segment(kind="policy", token_ids=[3], logprobs=[-0.1],
                                                             policy_version=4)]
    same = [base[0], base[1].model_copy(update={"logprobs": [-0.2]})]
    other_version = [base[0], base[1].model_copy(update={"policy_version": 5})]
    other_tokens = [base[0], base[1].model_copy(update={"token_ids": [4]})]
    assert segments_digest(base) == segments_digest(same)
    assert segments_digest(base) != segments_digest(other_version)
    assert segments_digest(base) != segments_digest(other_tokens)


# ---- a full disk ----


class FullDisk:
    """Stands in for os.write on a disk with `room` bytes left: a write gets what fits (a short
    write), the next one ENOSPC, as Linux does. `room=None` is a disk with space again."""

    def __init__(self, room: int | None) -> None:
        self.room = room
        self.refused = 0
        self._write = os.write

    def __call__(self, fd: int, data) -> int:
        if self.room is None:
            return self._write(fd, data)
        if self.room == 0:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = self._write(fd, bytes(data[: self.room]))
        self.room -= written
        return written


def admitted(log: AuditLog, *group_ids: str) -> None:
    for gid in group_ids:
        log.emit(GroupAdmitted, group_id=gid, size=2)


def groups(tmp_path) -> list[str]:
    return [e.group_id for e in read_audit(tmp_path)]


def test_a_full_disk_keeps_every_event_and_never_leaves_part_of_a_line(tmp_path, monkeypatch) -> None:
    log = AuditLog(tmp_path / AUDIT_FILE, 1)
    admitted(log, "g1", "g2")
    log.flush()
    before = (tmp_path / AUDIT_FILE).read_bytes()
    admitted(log, "g3", "g4", "g5")
    disk = FullDisk(room=30)  # part of g3's line fits, then the disk is full
    monkeypatch.setattr(os, "write", disk)

    with pytest.raises(OSError) as info:
        log.flush()
    assert info.value.errno == errno.ENOSPC
    assert (tmp_path / AUDIT_FILE).read_bytes() == before  # the 30 bytes that fit were cut back
    assert log.pending == 3
    with pytest.raises(OSError):
        log.flush()  # still full: nothing written, nothing lost
    admitted(log, "g6")

    disk.room = None
    log.flush()
    assert groups(tmp_path) == ["g1", "g2", "g3", "g4", "g5", "g6"]  # each once, in order
    assert log.pending == 0


def test_a_failed_fsync_is_undone_and_written_again(tmp_path, monkeypatch) -> None:
    log = AuditLog(tmp_path / AUDIT_FILE, 1)
    admitted(log, "g1")
    log.flush()
    before = (tmp_path / AUDIT_FILE).read_bytes()
    admitted(log, "g2")
    real_fsync = os.fsync
    failures = iter([OSError(errno.ENOSPC, "No space left on device")])

    def fsync(fd: int) -> None:
        err = next(failures, None)
        if err is not None:
            raise err  # the data reached the page cache but not the disk (NFS, delayed allocation)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError):
        log.flush()
    assert (tmp_path / AUDIT_FILE).read_bytes() == before
    log.flush()
    assert groups(tmp_path) == ["g1", "g2"]


def test_a_torn_tail_left_by_a_crash_is_cut_off_before_the_next_append(tmp_path, caplog) -> None:
    first = AuditLog(tmp_path / AUDIT_FILE, 1)
    admitted(first, "g1")
    first.flush()
    with open(tmp_path / AUDIT_FILE, "ab") as f:
        f.write(b'{"t": 1, "inc": 1, "event": "group_adm')  # the process died mid-write

    second = AuditLog(tmp_path / AUDIT_FILE, 2)
    admitted(second, "g2")
    with caplog.at_level(logging.WARNING, logger="turnkeep.files"):
        second.flush()
    assert [(e.inc, e.group_id) for e in read_audit(tmp_path)] == [(1, "g1"), (2, "g2")]
    assert any("torn line" in r.getMessage() and AUDIT_FILE in r.getMessage() for r in caplog.records)


def test_the_reader_skips_only_a_torn_last_line_and_refuses_a_torn_middle_one(tmp_path) -> None:
    log = AuditLog(tmp_path / AUDIT_FILE, 1)
    admitted(log, "g1")
    log.flush()
    good = (tmp_path / AUDIT_FILE).read_bytes()
    (tmp_path / AUDIT_FILE).write_bytes(good + good[:25])
    assert groups(tmp_path) == ["g1"]
    (tmp_path / AUDIT_FILE).write_bytes(good + good[:25] + good)  # something appended after the tear
    with pytest.raises(DamagedJsonl, match=rf"{AUDIT_FILE} line 2 \(byte {len(good)}\)"):
        list(read_audit(tmp_path))


def test_the_flusher_reports_a_full_disk_once_retries_and_says_when_it_writes_again(
    tmp_path, monkeypatch, caplog
) -> None:
    disk = FullDisk(room=0)
    monkeypatch.setattr(os, "write", disk)

    async def scenario() -> None:
        log = AuditLog(tmp_path / AUDIT_FILE, 1, flush_interval_s=0.01, retry_max_s=0.04)
        log.start()
        admitted(log, "g1")
        await asyncio.sleep(0.4)
        assert disk.refused >= 3  # it kept trying
        assert not log._task.done()
        admitted(log, "g2")
        disk.room = None
        await asyncio.sleep(0.2)
        assert groups(tmp_path) == ["g1", "g2"]
        await log.close()

    with caplog.at_level(logging.WARNING, logger="turnkeep.audit"):
        asyncio.run(scenario())
    failed = [r.getMessage() for r in caplog.records if "write failed" in r.getMessage()]
    assert len(failed) == 1  # once for the streak, not once per retry
    assert str(tmp_path / AUDIT_FILE) in failed[0] and "ENOSPC" in failed[0] and "Errno 28" in failed[0]
    assert any("written again" in r.getMessage() for r in caplog.records)


def test_at_the_buffer_bound_new_events_are_dropped_counted_and_reported(tmp_path, monkeypatch, caplog) -> None:
    # A fixed clock: a timestamp that rounds to fewer digits would make a line shorter than the bound assumes.
    monkeypatch.setattr(time, "time", lambda: 1_765_000_000.1234)
    line = len(orjson.dumps(GroupAdmitted(t=time.time(), inc=1, group_id="g0", size=2).model_dump(mode="json"))) + 1
    log = AuditLog(tmp_path / AUDIT_FILE, 1, max_buffer_bytes=3 * line + 5)
    disk = FullDisk(room=0)
    monkeypatch.setattr(os, "write", disk)
    with caplog.at_level(logging.WARNING, logger="turnkeep.audit"):
        admitted(log, *(f"g{i}" for i in range(6)))
        assert (log.pending, log.dropped) == (3, 3)
        dropping = [r for r in caplog.records if "dropped" in r.getMessage()]
        assert len(dropping) == 1 and dropping[0].levelno == logging.ERROR
        disk.room = None
        log.flush()
    assert groups(tmp_path) == ["g0", "g1", "g2"]
    assert any("3 events were dropped" in r.getMessage() for r in caplog.records)


def test_the_bound_writes_first_when_the_disk_takes_writes(tmp_path) -> None:
    log = AuditLog(tmp_path / AUDIT_FILE, 1, max_buffer_bytes=200)
    admitted(log, *(f"g{i}" for i in range(10)))  # nobody flushes: the bound does
    log.flush()
    assert log.dropped == 0
    assert groups(tmp_path) == [f"g{i}" for i in range(10)]
