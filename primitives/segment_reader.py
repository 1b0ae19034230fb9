"""Reading a journal back between two positions, and pruning the segments nobody will read again."""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import BinaryIO

from turnkeep.primitives.atomic_files import fsync_dir
from turnkeep.primitives.segment_format import (
    DAMAGED,
    BadRecord,
    JournalCorrupt,
    LogPosition,
    chain_step,
    is_torn_tail,
    list_segments,
    read_header,
    read_record,
)


def read_records(directory: Path, log_id: str, start: LogPosition, end: LogPosition) -> Iterator[bytes]:
    """The payloads of records start.seq .. end.seq-1, checked against both positions' chains.

    Reading starts at the newest segment whose first_seq <= start.seq and checks the chain reaches start.chain
    (else the journal is not the one the position was taken from) and, at end.seq, end.chain. Records after
    end.seq are never read, so a torn tail after `end` is harmless. Damage, a missing segment, a journal that
    ends before `end` or a chain that differs raise JournalCorrupt naming the file and the offset; payloads
    before the failure have been yielded by then, so a replay must treat the error as fatal.
    """
    if start.seq > end.seq:
        raise ValueError(f"start seq {start.seq} is after end seq {end.seq}")
    return _read_records(Path(directory), log_id, start, end)


def read_records_to_end(directory: Path, log_id: str, start: LogPosition) -> Iterator[bytes]:
    """The payloads of records from start.seq to the last whole one: a torn tail (a record cut short by a crash
    in the newest segment) ends the journal quietly. Damage before it, a missing segment or a chain that is not
    the position's raise JournalCorrupt after the payloads before it were yielded; every prefix of a journal is a
    state its writer held, so a reader may keep what it got and say why it stopped."""
    return _read_records(Path(directory), log_id, start, None)


def _read_records(directory: Path, log_id: str, start: LogPosition, end: LogPosition | None) -> Iterator[bytes]:
    segments = list_segments(directory)
    index = _first_segment(directory, segments, start)
    seq, chain = segments[index][0], b""
    for number in range(index, len(segments)):
        first, path = segments[number]
        if first != seq:
            raise JournalCorrupt(f"{path}: the segment starts at seq {first}, but the one before it ends at seq "
                                 f"{seq}: a segment is missing; {DAMAGED}")
        with _open_segment(path, start) as f:
            chain, offset = _segment_start(f, path, log_id, first, None if number == index else chain)
            newest = number == len(segments) - 1
            ended, seq, chain = yield from _segment_records(f, path, offset, seq, chain, start, end, newest)
        if ended:
            return


def _first_segment(directory: Path, segments: list[tuple[int, Path]], start: LogPosition) -> int:
    """The index of the newest segment whose first record is at or before the position's."""
    if not segments:
        raise JournalCorrupt(f"{directory} holds no journal segment, yet a position at seq {start.seq} needs "
                             f"one: the journal directory is wrong, or was emptied")
    index = max((i for i, (first, _) in enumerate(segments) if first <= start.seq), default=None)
    if index is None:
        raise JournalCorrupt(f"{segments[0][1]}: the position at seq {start.seq} is older than the oldest kept "
                             f"segment, which starts at seq {segments[0][0]}: the records it needs were pruned "
                             f"(replay from a newer snapshot)")
    return index


def _open_segment(path: Path, start: LogPosition) -> BinaryIO:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise JournalCorrupt(f"{path}: the segment was removed while it was being read (a prune ran "
                             f"meanwhile?); the position at seq {start.seq} may be older than the oldest kept "
                             f"segment now") from None


def _segment_start(f: BinaryIO, path: Path, log_id: str, first: int, chain: bytes | None) -> tuple[bytes, int]:
    """The chain a segment starts with and the offset of its first record, checked against its name and against
    `chain`, the chain the segment before it ended with (None: the first segment read, whose header is trusted)."""
    header = read_header(f, path, log_id)
    if header is None or header.first != first:
        what = "ends inside its header" if header is None else f"header says seq {header.first}"
        raise JournalCorrupt(f"{path} offset 0: the segment {what}, which its name and its place in the "
                             f"journal contradict; {DAMAGED}")
    if chain is not None and header.chain != chain:
        raise JournalCorrupt(f"{path} offset {header.size - 32}: the segment's starting chain differs "
                             f"from the chain the segment before it ends with; {DAMAGED}")
    return header.chain, header.size


def _segment_records(f: BinaryIO, path: Path, offset: int, seq: int, chain: bytes, start: LogPosition,
                     end: LogPosition | None, newest: bool) -> Generator[bytes, None, tuple[bool, int, bytes]]:
    """Yield the segment's payloads from `start.seq` on; returns whether the reading ended in it, and the seq and
    chain it reached."""
    size = os.fstat(f.fileno()).st_size
    while True:
        if _reached_end(path, offset, seq, chain, start, end):
            return True, seq, chain
        try:
            record = read_record(f, offset, size)
        except BadRecord as bad:
            # In the newest segment a torn tail means the journal ends here; damage raises in the check.
            torn = newest and is_torn_tail(f, path, bad, size)
            if end is None and torn:
                return True, seq, chain
            wanted = None if end is None else end.seq
            raise JournalCorrupt(_read_failure(path, bad.offset, bad.problem, seq, wanted, torn)) from None
        if record is None:
            if newest and end is None:
                return True, seq, chain
            if newest:
                raise JournalCorrupt(_read_failure(path, offset, "the end of the newest segment", seq,
                                                   end.seq, newest))
            return False, seq, chain
        payload, offset = record
        chain = chain_step(chain, payload)
        if seq >= start.seq:
            yield payload
        seq += 1


def _reached_end(path: Path, offset: int, seq: int, chain: bytes, start: LogPosition, end: LogPosition | None) -> bool:
    """Whether `seq` is the end position's; the chain must be the position's at both ends."""
    if seq == start.seq and chain != start.chain_bytes:
        raise JournalCorrupt(f"{path} offset {offset}: the chain at seq {seq} is {chain.hex()}, not "
                             f"the position's {start.chain}: not the journal this position was "
                             f"taken from (another run's journal, or one that was rewritten)")
    if end is None or seq != end.seq:
        return False
    if chain != end.chain_bytes:
        raise JournalCorrupt(f"{path} offset {offset}: the chain at seq {seq} is {chain.hex()}, "
                             f"not the end position's {end.chain}: the records read are not the "
                             f"ones the position counted (the journal or the position was "
                             f"altered)")
    return True


def _read_failure(path: Path, offset: int, problem: str, seq: int, wanted: int | None, at_end: bool) -> str:
    if wanted is None:
        return f"{path} offset {offset}: {problem} at seq {seq}, before the journal's last record; {DAMAGED}"
    if at_end:
        return (f"{path} offset {offset}: {problem}: the journal ends at seq {seq} before the position seq "
                f"{wanted}: records the position counted were never made durable (the position was taken "
                f"before a sync, or the journal was cut short)")
    return f"{path} offset {offset}: {problem} at seq {seq}, before the position seq {wanted}; {DAMAGED}"


def prune_before(directory: Path, seq: int, *, between: Callable[[], None] | None = None) -> list[Path]:
    """Delete the segments that hold only records before `seq`; never the newest one. Returns the removed paths.

    A segment is deletable when the next one starts at or before `seq`. They go oldest first, so a crash midway
    leaves a journal without holes that still reads from `seq`. `between` is called after the first deletion
    (tests use it to simulate a crash mid-prune).
    """
    directory = Path(directory)
    segments = list_segments(directory)
    doomed = [path for (_, path), (next_first, _) in zip(segments, segments[1:]) if next_first <= seq]
    removed: list[Path] = []
    try:
        for path in doomed:
            path.unlink()
            removed.append(path)
            if between is not None and len(removed) == 1:
                between()
    finally:
        if removed:
            fsync_dir(directory)
    return removed


def oldest_position(directory: Path, log_id: str) -> LogPosition | None:
    """Where the oldest kept segment starts (its first seq and the chain there): a reader that wants everything
    still on disk starts here. None when the journal has no segment."""
    segments = list_segments(Path(directory))
    if not segments:
        return None
    _, path = segments[0]
    with open(path, "rb") as f:
        header = read_header(f, path, log_id)
    if header is None:
        raise JournalCorrupt(f"{path}: the oldest segment's header is unfinished; {DAMAGED}")
    return LogPosition(seq=header.first, chain=header.chain.hex())
