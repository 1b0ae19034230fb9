"""The on-disk format of a segmented journal, and how a segment is read back and judged.

See `primitives.segment_log` for what the journal promises. Here: the file names, the
segment header and the record framing, the chain digest, `LogPosition`, the errors, and
the scan that tells a torn tail (the only damage a crash can leave) from real damage.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAGIC = b"TKSEG1\n"
SEGMENT_SUFFIX = ".seg"
ZERO_CHAIN = bytes(32)
DEFAULT_SEGMENT_BYTES = 64 << 20

_ID_LENGTH = struct.Struct(">H")
_HEADER_TAIL = struct.Struct(">Q32s")
RECORD = struct.Struct(">II")
MAX_PAYLOAD = 0xFFFFFFFF
_SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")
_HEX = frozenset("0123456789abcdef")
_ZERO_CHUNK = 64 << 10

DAMAGED = ("a crash can only tear the last record of the newest segment, so the journal was damaged after it "
            "was written (disk, copy or hand edit); restore the directory from a backup, or recover from a "
            "snapshot and start a new journal directory")

log = logging.getLogger("turnkeep.journal")


class JournalCorrupt(Exception):
    """The journal on disk is not one this module wrote and a crash could leave; the message says where and why."""


class ForeignJournal(JournalCorrupt):
    """A segment belongs to another journal (its log id differs from the expected one)."""


class JournalInUse(RuntimeError):
    """Another `SegmentLog` (in this process or another) has the directory open for appending."""


@dataclass(frozen=True)
class LogPosition:
    """A point in a journal: `seq` records before it, and the hex chain digest after them."""

    seq: int
    chain: str

    def __post_init__(self) -> None:
        if type(self.seq) is not int or self.seq < 0:
            raise ValueError(f"a log position's seq must be an int >= 0, got {self.seq!r}")
        if not isinstance(self.chain, str) or len(self.chain) != 64 or not set(self.chain) <= _HEX:
            raise ValueError(f"a log position's chain must be 64 lowercase hex digits, got {self.chain!r}")

    def to_dict(self) -> dict:
        return {"seq": self.seq, "chain": self.chain}

    @classmethod
    def from_dict(cls, raw: dict) -> LogPosition:
        """Parse `to_dict`'s output; a malformed one raises JournalCorrupt (it came from a saved state)."""
        if not isinstance(raw, dict):
            raise JournalCorrupt(f"a saved log position must be a dict with 'seq' and 'chain', got {raw!r}")
        missing = sorted({"seq", "chain"} - raw.keys())
        unknown = sorted(set(raw) - {"seq", "chain"}, key=str)
        if missing or unknown:
            raise JournalCorrupt(f"a saved log position must have exactly the keys 'seq' and 'chain' (missing "
                                 f"{missing}, unknown {unknown}) in {raw!r}; the state that holds it is damaged")
        try:
            return cls(seq=raw["seq"], chain=raw["chain"])
        except ValueError as err:
            raise JournalCorrupt(f"a saved log position is malformed: {err}; the state that holds it is "
                                 f"damaged") from None

    @property
    def chain_bytes(self) -> bytes:
        return bytes.fromhex(self.chain)


def segment_name(first: int) -> str:
    """The file name of the segment whose first record is record `first`."""
    return f"{first:020d}{SEGMENT_SUFFIX}"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(first_seq, path) of every segment, oldest first; other files (editor droppings, temp files) are ignored."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), directory / name) for name in names if (m := _SEGMENT_NAME.match(name))]
    return sorted(found)


def first_seq(directory: Path) -> int | None:
    """The oldest kept segment's first_seq (records before it were pruned); None when there is no segment."""
    segments = list_segments(Path(directory))
    return segments[0][0] if segments else None


def chain_step(chain: bytes, payload: bytes) -> bytes:
    digest = hashlib.sha256(chain)
    digest.update(payload)
    return digest.digest()


def header_bytes(log_id: str, first: int, chain: bytes) -> bytes:
    raw_id = log_id.encode("utf-8")
    return MAGIC + _ID_LENGTH.pack(len(raw_id)) + raw_id + _HEADER_TAIL.pack(first, chain)


@dataclass(frozen=True)
class _Header:
    first: int
    chain: bytes
    size: int


def read_header(f: BinaryIO, path: Path, log_id: str) -> _Header | None:
    """The segment header at the start of `f`; None when the file ends inside it (a kill during rotation)."""
    magic = f.read(len(MAGIC))
    if magic != MAGIC:
        if len(magic) < len(MAGIC) and MAGIC.startswith(magic):
            return None
        raise JournalCorrupt(f"{path} offset 0: not a journal segment (it starts {magic!r}, not {MAGIC!r}); "
                             f"{DAMAGED}")
    raw = f.read(_ID_LENGTH.size)
    if len(raw) < _ID_LENGTH.size:
        return None
    (id_length,) = _ID_LENGTH.unpack(raw)
    raw_id = f.read(id_length)
    if len(raw_id) < id_length:
        return None
    try:
        found = raw_id.decode("utf-8")
    except UnicodeDecodeError:
        raise JournalCorrupt(f"{path} offset {len(MAGIC) + _ID_LENGTH.size}: the log id {raw_id!r} is not "
                             f"utf-8; {DAMAGED}") from None
    if found != log_id:
        raise ForeignJournal(f"{path}: this segment belongs to journal {found!r}, not {log_id!r}: the directory "
                             f"holds another journal's files; point this one at its own directory, or move the "
                             f"other journal's segments away")
    raw = f.read(_HEADER_TAIL.size)
    if len(raw) < _HEADER_TAIL.size:
        return None
    first, chain = _HEADER_TAIL.unpack(raw)
    size = len(MAGIC) + _ID_LENGTH.size + id_length + _HEADER_TAIL.size
    return _Header(first=first, chain=chain, size=size)


class BadRecord(Exception):
    """A record that fails its checks; `torn` when it has the shape a crash mid-write leaves."""

    def __init__(self, offset: int, problem: str, *, torn: bool, next_offset: int | None = None) -> None:
        super().__init__(problem)
        self.offset = offset
        self.problem = problem
        self.torn = torn
        # Where the next record would start, when the length field is usable (a bad crc, not a cut-off record).
        self.next_offset = next_offset


def read_record(f: BinaryIO, offset: int, size: int) -> tuple[bytes, int] | None:
    """The record at `offset` (where `f` is): its payload and the next record's offset; None at end of file."""
    if offset >= size:
        return None
    if size - offset < RECORD.size:
        raise BadRecord(offset, f"a record header cut short ({size - offset} of {RECORD.size} bytes before the "
                                 f"end of the file)", torn=True)
    length, crc = RECORD.unpack(f.read(RECORD.size))
    end = offset + RECORD.size + length
    if length == 0:
        # The writer never writes an empty record, so that zeros (a power loss's unwritten pages) never parse.
        raise BadRecord(offset, "a record of length 0, which the writer never writes", torn=False,
                         next_offset=end)
    if end > size:
        raise BadRecord(offset, f"a record of {length} bytes that runs {end - size} bytes past the end of the "
                                 f"file", torn=True)
    payload = f.read(length)
    if len(payload) != length or zlib.crc32(payload) != crc:
        raise BadRecord(offset, f"a record of {length} bytes whose crc32 does not match its payload", torn=False,
                         next_offset=end)
    return payload, end


def _zero_to_eof(f: BinaryIO, offset: int, size: int) -> bool:
    """True when every byte from `offset` to the end of the file is zero (pages a power loss never wrote)."""
    f.seek(offset)
    while offset < size:
        chunk = f.read(min(_ZERO_CHUNK, size - offset))
        if not chunk:
            return True
        if chunk.count(0) != len(chunk):
            return False
        offset += len(chunk)
    return True


def _valid_record_after(f: BinaryIO, bad: BadRecord, size: int) -> int | None:
    """The offset of a valid record after the bad one, following the length fields; None if none follows."""
    offset = bad.next_offset
    while offset is not None and offset < size:
        f.seek(offset)
        try:
            if read_record(f, offset, size) is not None:
                return offset
        except BadRecord as later:
            offset = later.next_offset
    return None


def is_torn_tail(f: BinaryIO, path: Path, bad: BadRecord, size: int) -> bool:
    """Whether the bad record is what a crash mid-write leaves at the end of the newest segment.

    A crash leaves a cut-off record, zeros, or (power loss) records whose pages were only partly written, but never
    a valid record after a bad one: that is damage, and raises JournalCorrupt.
    """
    if bad.torn or _zero_to_eof(f, bad.offset, size):
        return True
    valid = _valid_record_after(f, bad, size)
    if valid is None:
        return True
    raise JournalCorrupt(f"{path} offset {bad.offset}: {bad.problem}, followed by a valid record at offset "
                         f"{valid}; {DAMAGED}")


@dataclass(frozen=True)
class SegmentEnd:
    """What recovery learned from one segment."""

    path: Path
    first: int
    start_chain: bytes
    seq: int  # records before the end of the segment
    chain: bytes  # the chain after them
    size: int  # bytes of the header and the good records
    file_size: int


def scan_segment(path: Path, first: int, log_id: str, *, last: bool) -> SegmentEnd | None:
    """Check a whole segment; None for a newest segment whose header a kill during rotation left unfinished.

    Only the newest segment (`last`) may end in a torn record; its good part is returned and the caller cuts
    the rest off.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        # Zeros: the header's pages never reached the disk (power loss during rotation).
        if last and _zero_to_eof(f, 0, size):
            return None
        f.seek(0)
        header = read_header(f, path, log_id)
        if header is None:
            if last:
                return None
            raise JournalCorrupt(f"{path} offset 0: the segment ends inside its header ({size} bytes), which only "
                                 f"the newest segment can after a crash; {DAMAGED}")
        if header.first != first:
            raise JournalCorrupt(f"{path} offset {len(MAGIC)}: the header says the segment starts at seq "
                                 f"{header.first}, its name says {first}; {DAMAGED}")
        seq, chain, offset = header.first, header.chain, header.size
        while True:
            try:
                record = read_record(f, offset, size)
            except BadRecord as bad:
                if last and is_torn_tail(f, path, bad, size):
                    break
                raise JournalCorrupt(f"{path} offset {bad.offset}: {bad.problem} in a segment that is not the "
                                     f"newest one; {DAMAGED}") from None
            if record is None:
                break
            payload, offset = record
            chain = chain_step(chain, payload)
            seq += 1
    return SegmentEnd(path=path, first=first, start_chain=header.chain, seq=seq, chain=chain, size=offset,
                       file_size=size)
