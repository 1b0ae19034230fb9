"""The segmented journal: round trips, group commit, torn tails cut, damage refused, kills, pruning, positions."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import inspect
import logging
import os
import random
import selectors
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from turnkeep.primitives import segment_format
from turnkeep.primitives.segment_format import (
    MAGIC,
    ZERO_CHAIN,
    ForeignJournal,
    JournalCorrupt,
    JournalInUse,
    LogPosition,
    first_seq,
    segment_name,
)
from turnkeep.primitives.segment_log import SegmentLog
from turnkeep.primitives.segment_reader import prune_before, read_records, read_records_to_end

REPO = Path(__file__).resolve().parents[2]
LOG_ID = "run-7/journal"
START = LogPosition(seq=0, chain=ZERO_CHAIN.hex())


def payload(i: int) -> bytes:
    # Sizes from 1 to 300 bytes, contents that differ record to record.
    return f"r{i}:".encode() + bytes([i % 251]) * (i * 37 % 300)


def write_log(directory: Path, count: int, *, segment_bytes: int = 4096) -> list[LogPosition]:
    """A closed journal of `count` payloads; positions[k] is the position after k records."""
    with SegmentLog(directory, LOG_ID, segment_bytes=segment_bytes) as log:
        positions = [log.position()]
        for i in range(count):
            log.append(payload(i))
            positions.append(log.position())
            if i % 10 == 9:
                log.sync_blocking()  # segments rotate only between batches
        log.sync_blocking()
    return positions


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def record_offsets(path: Path) -> list[tuple[int, int]]:
    """(offset, payload length) of each record in a segment, parsed from the documented format."""
    data = path.read_bytes()
    assert data.startswith(MAGIC)
    (id_length,) = struct.unpack(">H", data[len(MAGIC):len(MAGIC) + 2])
    offset, found = len(MAGIC) + 2 + id_length + 8 + 32, []
    while offset < len(data):
        length, _ = struct.unpack(">II", data[offset:offset + 8])
        found.append((offset, length))
        offset += 8 + length
    assert offset == len(data)
    return found


def reopen_position(directory: Path) -> LogPosition:
    with SegmentLog(directory, LOG_ID) as log:
        return log.position()


def test_a_round_trip_over_many_segments_reads_every_payload_and_reopens_at_the_same_position(tmp_path) -> None:
    async def scenario() -> LogPosition:
        with SegmentLog(tmp_path, LOG_ID, segment_bytes=4096) as log:
            for i in range(1000):
                seq = log.append(payload(i))
                if i % 9 == 0:
                    await log.durable(seq)
            await log.durable(log.position().seq)
            assert log.durable_seq == 1000
            return log.position()

    end = asyncio.run(scenario())
    assert end.seq == 1000
    assert len(segment_files(tmp_path)) > 20
    assert list(read_records(tmp_path, LOG_ID, START, end)) == [payload(i) for i in range(1000)]
    assert reopen_position(tmp_path) == end
    # The names say where each segment starts: the first one at 0, each later one after the records before it.
    firsts = [int(p.name.removesuffix(".seg")) for p in segment_files(tmp_path)]
    counts = [len(record_offsets(p)) for p in segment_files(tmp_path)]
    assert firsts == [sum(counts[:k]) for k in range(len(counts))]


def test_concurrent_appenders_share_fsyncs(tmp_path, monkeypatch) -> None:
    log = SegmentLog(tmp_path, LOG_ID)
    fsyncs = 0
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        nonlocal fsyncs
        fsyncs += 1
        real_fsync(fd)

    async def appender(i: int) -> int:
        seq = log.append(payload(i))
        await log.durable(seq)
        assert log.durable_seq >= seq
        return seq

    async def scenario() -> list[int]:
        return await asyncio.gather(*(appender(i) for i in range(200)))

    monkeypatch.setattr(os, "fsync", counting_fsync)
    seqs = asyncio.run(scenario())
    monkeypatch.undo()
    log.close()
    assert sorted(seqs) == list(range(1, 201))
    assert 1 <= fsyncs <= 5  # one fsync per appender would be 200
    assert list(read_records(tmp_path, LOG_ID, START, reopen_position(tmp_path))) == [payload(i) for i in range(200)]


TORN_TAILS = {
    "half a header": b"\x00\x00\x10\x00\xab\xcd",
    "a payload past the end": struct.pack(">II", 1000, 12345) + b"only a few bytes",
    "a bad crc on the last record": struct.pack(">II", 3, zlib.crc32(b"abc") ^ 1) + b"abc",
    "a bad crc then a cut-off record": struct.pack(">II", 3, 7) + b"abc" + struct.pack(">II", 50, 1) + b"x",
    "trailing zeros": bytes(37),
}


@pytest.mark.parametrize("tail", TORN_TAILS.values(), ids=TORN_TAILS.keys())
def test_a_torn_tail_is_cut_off_on_open_and_appends_continue(tmp_path, caplog, tail: bytes) -> None:
    positions = write_log(tmp_path, 120)
    newest = segment_files(tmp_path)[-1]
    good_size = newest.stat().st_size
    with open(newest, "ab") as f:
        f.write(tail)
    # Readers never look past their end position, so a torn tail there is harmless.
    assert list(read_records(tmp_path, LOG_ID, positions[100], positions[120])) == [payload(i) for i in
                                                                                   range(100, 120)]
    with caplog.at_level(logging.WARNING, logger="turnkeep.journal"):
        log = SegmentLog(tmp_path, LOG_ID, segment_bytes=4096)
    assert "torn tail" in caplog.text and newest.name in caplog.text
    assert log.position() == positions[120]
    assert newest.stat().st_size == good_size
    for i in range(120, 150):
        log.append(payload(i))
    end = log.sync_blocking()
    log.close()
    assert list(read_records(tmp_path, LOG_ID, START, end)) == [payload(i) for i in range(150)]
    assert reopen_position(tmp_path) == end


@pytest.mark.parametrize("where", ["newest segment", "older segment"])
def test_a_damaged_record_before_the_end_is_refused_by_open_and_by_read(tmp_path, where: str) -> None:
    positions = write_log(tmp_path, 300)
    segments = segment_files(tmp_path)
    damaged = segments[-1] if where == "newest segment" else segments[len(segments) // 2]
    records = record_offsets(damaged)
    assert len(records) >= 3
    offset, length = records[len(records) // 2]
    data = bytearray(damaged.read_bytes())
    data[offset + 8 + length // 2] ^= 0xFF  # one payload byte: the crc no longer matches
    damaged.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt, match=f"{damaged.name} offset {offset}: .*crc32"):
        SegmentLog(tmp_path, LOG_ID, segment_bytes=4096)
    with pytest.raises(JournalCorrupt, match=f"{damaged.name} offset {offset}"):
        list(read_records(tmp_path, LOG_ID, START, positions[-1]))
    # Opening refused without cutting anything: the damaged file is as it was.
    assert damaged.read_bytes() == bytes(data)


@pytest.mark.parametrize("tail", [b"", *TORN_TAILS.values()], ids=["clean end", *TORN_TAILS.keys()])
def test_reading_to_the_end_yields_every_whole_record_and_stops_quietly_at_a_torn_tail(tmp_path, tail) -> None:
    positions = write_log(tmp_path, 120)
    with open(segment_files(tmp_path)[-1], "ab") as f:
        f.write(tail)
    assert list(read_records_to_end(tmp_path, LOG_ID, positions[37])) == [payload(i) for i in range(37, 120)]
    assert list(read_records_to_end(tmp_path, LOG_ID, positions[120])) == []


def test_reading_to_the_end_yields_the_prefix_before_damage_then_names_it(tmp_path) -> None:
    write_log(tmp_path, 300)
    damaged = segment_files(tmp_path)[len(segment_files(tmp_path)) // 2]
    offset, length = record_offsets(damaged)[2]
    data = bytearray(damaged.read_bytes())
    data[offset + 8 + length // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    got = []
    with pytest.raises(JournalCorrupt, match=f"{damaged.name} offset {offset}: .*before the journal's last record"):
        for record in read_records_to_end(tmp_path, LOG_ID, START):
            got.append(record)
    assert got == [payload(i) for i in range(len(got))] and 0 < len(got) < 300


def test_reading_to_the_end_from_another_journals_position_is_refused(tmp_path) -> None:
    write_log(tmp_path, 50)
    with pytest.raises(JournalCorrupt, match="not the journal this position was taken from"):
        list(read_records_to_end(tmp_path, LOG_ID, LogPosition(seq=10, chain="ab" * 32)))


def kill_payload(i: int) -> bytes:
    return b"kill-%d-" % i * (i % 13 + 1)


KILLED_WRITER = inspect.getsource(kill_payload) + """
import asyncio, random, sys
from pathlib import Path
from turnkeep.primitives.segment_log import SegmentLog


async def main(directory: str) -> None:
    log = SegmentLog(Path(directory), "killed", segment_bytes=2048)
    rng = random.Random()
    while True:
        for _ in range(rng.randint(1, 40)):
            log.append(kill_payload(log.position().seq))
        seq = log.position().seq
        await log.durable(seq)
        print(seq, flush=True)


asyncio.run(main(sys.argv[1]))
"""


def read_lines_until(proc: subprocess.Popen, count: int, timeout_s: float) -> bytes:
    """What `proc` printed once it printed `count` lines (or the timeout passed)."""
    out, deadline = b"", time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while out.count(b"\n") < count and time.monotonic() < deadline:
            if selector.select(timeout=deadline - time.monotonic()):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
    return out


def test_a_writer_killed_at_random_moments_loses_nothing_it_reported_durable(tmp_path) -> None:
    rng = random.Random(0)
    start = LogPosition(seq=0, chain=ZERO_CHAIN.hex())
    reported_before = 0
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=REPO,
                                stdout=subprocess.PIPE)
        try:
            out = read_lines_until(proc, 3, timeout_s=15)
            time.sleep(rng.uniform(0, 0.03))
            proc.send_signal(signal.SIGKILL)
            out += proc.communicate(timeout=10)[0]
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL  # it was still writing when killed
        reported = [int(line) for line in out.split(b"\n")[:-1]]
        assert len(reported) >= 3 and reported == sorted(reported)
        assert reported[0] > reported_before  # it continued from the recovered journal
        with SegmentLog(tmp_path, "killed", segment_bytes=2048) as log:
            end = log.position()
        assert end.seq >= reported[-1]
        assert list(read_records(tmp_path, "killed", start, end)) == [kill_payload(i) for i in range(end.seq)]
        reported_before = end.seq
    assert len(segment_files(tmp_path)) > 1


HEADER = segment_format.header_bytes(LOG_ID, 120, bytes(32))
PARTIAL_HEADERS = {
    "empty": b"",
    "part of the magic": MAGIC[:4],
    "part of the log id": MAGIC + struct.pack(">H", len(LOG_ID)) + LOG_ID.encode()[:3],
    "all but the chain's end": HEADER[:-5],
    "zeros": bytes(len(HEADER)),
}


@pytest.mark.parametrize("partial", PARTIAL_HEADERS.values(), ids=PARTIAL_HEADERS.keys())
def test_a_segment_left_unfinished_by_a_kill_during_rotation_is_removed(tmp_path, caplog, partial: bytes) -> None:
    positions = write_log(tmp_path, 120)
    unfinished = tmp_path / segment_name(120)
    assert not unfinished.exists()
    unfinished.write_bytes(partial)
    with caplog.at_level(logging.WARNING, logger="turnkeep.journal"):
        log = SegmentLog(tmp_path, LOG_ID, segment_bytes=4096)
    assert not unfinished.exists() and unfinished.name in caplog.text
    assert log.position() == positions[120]
    for i in range(120, 160):
        log.append(payload(i))
    end = log.sync_blocking()
    log.close()
    assert list(read_records(tmp_path, LOG_ID, START, end)) == [payload(i) for i in range(160)]


def test_an_unfinished_only_segment_leaves_a_journal_that_starts_at_its_base(tmp_path) -> None:
    (tmp_path / segment_name(0)).write_bytes(MAGIC[:5])
    base = LogPosition(seq=40, chain=hashlib.sha256(b"saved state").hexdigest())
    with SegmentLog(tmp_path, LOG_ID, base=base) as log:
        assert log.position() == base
    assert [p.name for p in segment_files(tmp_path)] == [segment_name(40)]


def test_a_segment_cut_short_inside_its_header_is_refused_when_it_is_not_the_newest(tmp_path) -> None:
    write_log(tmp_path, 300)
    older = segment_files(tmp_path)[1]
    older.write_bytes(older.read_bytes()[:20])
    with pytest.raises(JournalCorrupt, match=f"{older.name} offset 0: the segment ends inside its header"):
        SegmentLog(tmp_path, LOG_ID)


def test_prune_removes_only_whole_older_segments_and_reads_from_the_prune_point(tmp_path) -> None:
    positions = write_log(tmp_path, 300)
    with SegmentLog(tmp_path, LOG_ID, segment_bytes=4096) as log:
        before = segment_files(tmp_path)
        firsts = [int(p.name.removesuffix(".seg")) for p in before]
        expected = [p for p, next_first in zip(before, firsts[1:]) if next_first <= 150]
        assert 1 <= len(expected) < len(before) - 1
        assert prune_before(tmp_path, 150) == expected
        assert segment_files(tmp_path) == before[len(expected):]
        oldest = first_seq(tmp_path)
        assert oldest is not None and oldest <= 150 < firsts[len(expected) + 1]
        # The writer carries on after a prune.
        for i in range(300, 320):
            log.append(payload(i))
        end = log.sync_blocking()
    assert list(read_records(tmp_path, LOG_ID, positions[150], end)) == [payload(i) for i in range(150, 320)]
    assert list(read_records(tmp_path, LOG_ID, positions[oldest], positions[151])) == [
        payload(i) for i in range(oldest, 151)]
    with pytest.raises(JournalCorrupt, match="older than the oldest kept segment"):
        list(read_records(tmp_path, LOG_ID, positions[oldest - 1], end))
    # Never the newest segment, whatever the seq.
    newest = segment_files(tmp_path)[-1]
    prune_before(tmp_path, 10**9)
    assert segment_files(tmp_path) == [newest]
    assert reopen_position(tmp_path) == end


def test_a_crash_in_the_middle_of_a_prune_leaves_a_journal_that_still_opens_and_reads(tmp_path) -> None:
    positions = write_log(tmp_path, 300)
    before = segment_files(tmp_path)

    def crash() -> None:
        raise RuntimeError("killed mid-prune")

    with pytest.raises(RuntimeError, match="killed mid-prune"):
        prune_before(tmp_path, 150, between=crash)
    assert segment_files(tmp_path) == before[1:]  # only the oldest went
    assert first_seq(tmp_path) == int(before[1].name.removesuffix(".seg"))
    assert reopen_position(tmp_path) == positions[300]
    assert list(read_records(tmp_path, LOG_ID, positions[150], positions[300])) == [payload(i) for i in
                                                                                   range(150, 300)]
    assert len(prune_before(tmp_path, 150)) >= 1  # the rest of the prune


def test_first_seq_of_a_missing_or_empty_directory_is_none(tmp_path) -> None:
    assert first_seq(tmp_path / "nowhere") is None
    assert first_seq(tmp_path) is None
    (tmp_path / "notes.txt").write_text("not a segment")
    assert first_seq(tmp_path) is None


def test_another_journals_directory_is_refused(tmp_path) -> None:
    positions = write_log(tmp_path, 10)
    with pytest.raises(ForeignJournal, match="belongs to journal 'run-7/journal', not 'run-8/journal'"):
        SegmentLog(tmp_path, "run-8/journal")
    with pytest.raises(ForeignJournal):
        list(read_records(tmp_path, "run-8/journal", START, positions[10]))
    assert issubclass(ForeignJournal, JournalCorrupt)


def test_a_directory_has_one_writer_at_a_time(tmp_path) -> None:
    log = SegmentLog(tmp_path, LOG_ID)
    with pytest.raises(JournalInUse, match="already open"):
        SegmentLog(tmp_path, LOG_ID)
    log.close()
    SegmentLog(tmp_path, LOG_ID).close()


BAD_POSITIONS = {
    "missing chain": {"seq": 3},
    "missing seq": {"chain": "ab" * 32},
    "short chain": {"seq": 3, "chain": "ab"},
    "not hex": {"seq": 3, "chain": "zz" * 32},
    "uppercase": {"seq": 3, "chain": "AB" * 32},
    "negative seq": {"seq": -1, "chain": "ab" * 32},
    "string seq": {"seq": "3", "chain": "ab" * 32},
    "bool seq": {"seq": True, "chain": "ab" * 32},
    "unknown key": {"seq": 3, "chain": "ab" * 32, "offset": 9},
    "not a dict": ["seq", 3],
}


@pytest.mark.parametrize("raw", BAD_POSITIONS.values(), ids=BAD_POSITIONS.keys())
def test_a_malformed_saved_position_is_refused(raw) -> None:
    with pytest.raises(JournalCorrupt, match="saved log position"):
        LogPosition.from_dict(raw)


def test_positions_round_trip_and_a_chain_that_differs_is_refused(tmp_path) -> None:
    positions = write_log(tmp_path, 200)
    assert LogPosition.from_dict(positions[77].to_dict()) == positions[77]
    tampered_end = LogPosition(seq=150, chain=positions[149].chain)
    with pytest.raises(JournalCorrupt, match="offset .*end position's"):
        list(read_records(tmp_path, LOG_ID, positions[100], tampered_end))
    foreign_start = LogPosition(seq=100, chain=hashlib.sha256(b"elsewhere").hexdigest())
    with pytest.raises(JournalCorrupt, match="not the journal this position was taken from"):
        list(read_records(tmp_path, LOG_ID, foreign_start, positions[150]))
    beyond = LogPosition(seq=230, chain=positions[200].chain)
    with pytest.raises(JournalCorrupt, match="ends at seq 200 before the position seq 230: records the position "
                                             "counted were never made durable"):
        list(read_records(tmp_path, LOG_ID, positions[190], beyond))
    # An empty range still proves the position belongs to this journal.
    assert list(read_records(tmp_path, LOG_ID, positions[150], positions[150])) == []


def test_a_failed_write_fails_its_waiters_and_the_next_durable_writes_it_once(tmp_path, monkeypatch) -> None:
    real_write = os.write
    failed: list[int] = []

    def full_disk_once(fd: int, data) -> int:
        if not failed and os.readlink(f"/proc/self/fd/{fd}").endswith(".seg"):
            failed.append(fd)
            real_write(fd, bytes(data[:len(data) // 2]))  # half the batch reaches the file first
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    async def scenario() -> tuple[list, LogPosition]:
        with SegmentLog(tmp_path, LOG_ID) as log:
            for i in range(20):
                log.append(payload(i))
            await log.sync()
            monkeypatch.setattr(os, "write", full_disk_once)
            first = log.append(payload(20))
            waiters = [asyncio.create_task(log.durable(first)) for _ in range(2)]
            await asyncio.sleep(0)  # the first batch (record 20 alone) is in flight
            later = asyncio.create_task(log.durable(log.append(payload(21))))
            results = await asyncio.gather(*waiters, later, return_exceptions=True)
            assert log.durable_seq == 22
            return results, log.position()

    results, end = asyncio.run(scenario())
    monkeypatch.undo()
    assert failed
    assert [type(r) for r in results[:2]] == [OSError, OSError] and results[0].errno == errno.ENOSPC
    assert results[2] is None  # its record was not in the failed batch
    assert end.seq == 22
    assert list(read_records(tmp_path, LOG_ID, START, end)) == [payload(i) for i in range(22)]
    assert reopen_position(tmp_path) == end


def test_a_fresh_journal_continues_the_numbering_of_its_base(tmp_path) -> None:
    base = LogPosition(seq=500, chain=hashlib.sha256(b"snapshot 12").hexdigest())
    with SegmentLog(tmp_path, LOG_ID, base=base) as log:
        assert log.position() == base
        assert log.append(payload(0)) == 501
        for i in range(1, 10):
            log.append(payload(i))
        end = log.sync_blocking()
    assert end.seq == 510
    assert [p.name for p in segment_files(tmp_path)] == [segment_name(500)]
    assert list(read_records(tmp_path, LOG_ID, base, end)) == [payload(i) for i in range(10)]
    assert reopen_position(tmp_path) == end  # the base is kept in the first segment's header
    with pytest.raises(JournalCorrupt, match="older than the oldest kept segment"):
        list(read_records(tmp_path, LOG_ID, START, end))


def test_misuse_is_refused(tmp_path) -> None:
    log = SegmentLog(tmp_path, LOG_ID)
    with pytest.raises(ValueError, match="1 to"):
        log.append(b"")
    with pytest.raises(TypeError):
        log.append(5)  # type: ignore[arg-type]
    log.append(b"x")
    with pytest.raises(ValueError, match="past the end"):
        asyncio.run(log.durable(2))
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.append(b"y")


def test_the_folders_it_makes_and_its_segments_are_the_users_alone_whatever_the_umask(tmp_path) -> None:
    """A journal holds agents' conversations: 0700 folders and 0600 segments even under a umask of 022."""
    old = os.umask(0o022)
    try:
        directory = tmp_path / "journals" / "env"
        write_log(directory, 40)  # several segments
    finally:
        os.umask(old)
    for folder in (tmp_path / "journals", directory):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    segments = list(directory.iterdir())
    assert len(segments) > 1 and all(p.stat().st_mode & 0o777 == 0o600 for p in segments), \
        [(p.name, oct(p.stat().st_mode)) for p in segments]
