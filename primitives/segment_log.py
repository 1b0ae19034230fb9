"""An append-only, segmented record log (a write-ahead journal) that survives a crash at any moment.

The controller journals its data plane here so that a restart replays exactly what was acknowledged. Three
properties carry that promise:

* Durability is explicit and cheap. `append` only buffers; `durable(seq)` waits until the records before `seq`
  are written and fsynced. One batch is in flight at a time and takes every record appended before it started,
  so a burst of writers shares one fsync (group commit) instead of paying one each.
* A crash can only tear the tail. Records are written in order into the newest segment, so a kill or power
  loss leaves at most a torn last record there, which the next open cuts off. Damage anywhere else (a bad
  record followed by a good one, any bad record in an older segment) is not something a crash can leave, and
  is refused loudly rather than silently skipped.
* A replay proves it read the right records. Every record extends a sha256 chain; a `LogPosition` carries the
  chain at its seq, so `read_records` checks that it started from, and stopped at, the very records the writer
  appended, and not those of another journal, a truncated one or one that was tampered with.

Segments let old records be deleted (`prune_before`) once a snapshot covers them, without rewriting anything.

Files: `<first_seq as 20 digits>.seg`, where first_seq counts the records before the segment's first one. A
segment is the header (magic, u16 length + utf-8 log id, u64 first_seq, the 32-byte chain at first_seq) and then
records (u32 payload length, u32 crc32 of the payload, the payload), all integers big-endian.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from turnkeep.primitives.atomic_files import fsync_dir, write_all
from turnkeep.primitives.segment_format import (
    DAMAGED,
    DEFAULT_SEGMENT_BYTES,
    MAX_PAYLOAD,
    RECORD,
    ZERO_CHAIN,
    JournalCorrupt,
    JournalInUse,
    LogPosition,
    SegmentEnd,
    chain_step,
    header_bytes,
    list_segments,
    log,
    scan_segment,
    segment_name,
)


@dataclass(frozen=True)
class _Batch:
    """Records `first`..`end`-1 (encoded), and the chain after the last of them."""

    first: int
    records: list[bytes]
    end: int
    end_chain: bytes


class SegmentLog:
    """The writer of one journal directory: appends, group-committed fsyncs, rotation, tail recovery.

    `append`, `durable` and `sync` belong to one asyncio loop thread. Only the batch writer touches the file: it
    runs in a worker thread under `_io_lock`, and owns the file state (`_fd`, `_seg_*`, `_file_seq`,
    `_file_chain`); the loop thread owns the buffer and the appended position.
    """

    def __init__(self, directory: Path, log_id: str, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 base: LogPosition | None = None) -> None:
        """Open for appending: creates the directory, recovers the tail, continues seq and chain from disk.

        In the newest segment only, a torn last record (cut short, running past the end of the file, zeros to
        the end, or a bad crc with no valid record after it) is cut off with a warning; a newest segment whose
        header is unfinished (a kill during rotation) is removed. Any other damage raises JournalCorrupt, another
        journal's segment ForeignJournal. An empty directory starts at `base` (default: seq 0, the zero chain)
        and records it in a first segment's header, so a journal that starts from a saved state continues that
        state's numbering; when segments exist, `base` is ignored.
        """
        raw_id = log_id.encode("utf-8")
        if not raw_id or len(raw_id) > 0xFFFF:
            raise ValueError(f"a log id must be 1 to 65535 utf-8 bytes, got {log_id!r}")
        if segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
        self.directory = Path(directory)
        self.log_id = log_id
        self._segment_bytes = segment_bytes
        self._io_lock = threading.Lock()
        self._flight: asyncio.Task[None] | None = None
        self._flight_end = 0
        self._closed = False
        self._fd: int | None = None
        self._needs_cut = False
        _make_private_dirs(self.directory)
        self._dir_fd = self._lock_directory()
        try:
            self._recover(base or LogPosition(seq=0, chain=ZERO_CHAIN.hex()))
        except BaseException:
            self._release()
            raise
        # The loop thread's view: everything appended, and the records not yet handed to a batch.
        self._seq, self._chain = self._file_seq, self._file_chain
        self._pending: list[bytes] = []
        self._pending_first = self._file_seq

    def _lock_directory(self) -> int:
        # Two writers appending to one segment would interleave records; the lock dies with its process.
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalInUse(f"{self.directory} is already open for appending (by this process or another); "
                               f"close that SegmentLog first") from None
        return fd

    def _recover(self, base: LogPosition) -> None:
        segments = list_segments(self.directory)
        ends: list[SegmentEnd] = []
        for index, (first, path) in enumerate(segments):
            end = scan_segment(path, first, self.log_id, last=index == len(segments) - 1)
            if end is None:
                log.warning("%s: removing the newest segment, whose header a crash during rotation left "
                            "unfinished (it holds no record)", path)
                path.unlink()
                fsync_dir(self.directory)
                break
            if ends and (end.first != ends[-1].seq or end.start_chain != ends[-1].chain):
                raise JournalCorrupt(f"{path} offset 0: the segment starts at seq {end.first} with chain "
                                     f"{end.start_chain.hex()[:16]}..., but {ends[-1].path.name} ends at seq "
                                     f"{ends[-1].seq} with chain {ends[-1].chain.hex()[:16]}...: records are "
                                     f"missing or do not belong together; {DAMAGED}")
            ends.append(end)
        if not ends:
            self._create_first_segment(base)
            return
        last = ends[-1]
        self._fd = os.open(last.path, os.O_WRONLY)
        if last.file_size > last.size:
            log.warning("%s: cutting off a torn tail of %d bytes at offset %d (a crash in the middle of a write; "
                        "those records were never reported durable)", last.path, last.file_size - last.size,
                        last.size)
            os.ftruncate(self._fd, last.size)
            os.fsync(self._fd)
        os.lseek(self._fd, last.size, os.SEEK_SET)
        self._seg_path, self._seg_first, self._seg_size = last.path, last.first, last.size
        self._file_seq, self._file_chain = last.seq, last.chain

    def _create_first_segment(self, base: LogPosition) -> None:
        self._file_seq, self._file_chain = base.seq, base.chain_bytes
        self._open_segment()

    def _open_segment(self) -> None:
        """Start a segment at `_file_seq` (header, fsync, directory fsync); on failure leave the current one."""
        path = self.directory / segment_name(self._file_seq)
        header = header_bytes(self.log_id, self._file_seq, self._file_chain)
        # O_TRUNC: a file of this name can only be a rotation that failed before (it holds no record).
        # 0600: a journal holds agents' conversations; only the run's user reads them, whatever the umask.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            write_all(fd, header, path)
            os.fsync(fd)
            fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            try:
                path.unlink(missing_ok=True)
            except OSError as err:
                # Harmless: an unfinished header is removed on open, a finished one is an empty segment.
                log.error("%s: could not remove a segment whose creation failed: %s", path, err)
            raise
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._seg_path = fd, path
        self._seg_first, self._seg_size = self._file_seq, len(header)

    def append(self, payload: bytes) -> int:
        """Buffer one record (no I/O); returns the seq after it, the position to pass to `durable`."""
        self._check_open()
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"a journal record is bytes, got {type(payload).__name__}")
        payload = bytes(payload)  # the caller may reuse a bytearray before the batch is written
        if not payload or len(payload) > MAX_PAYLOAD:
            # Empty payloads are refused so that zeros on disk (unwritten pages) never parse as records.
            raise ValueError(f"a journal record must hold 1 to {MAX_PAYLOAD} bytes, got {len(payload)}")
        self._pending.append(RECORD.pack(len(payload), zlib.crc32(payload)) + payload)
        self._chain = chain_step(self._chain, payload)
        self._seq += 1
        return self._seq

    def position(self) -> LogPosition:
        """The end of everything appended so far, buffered records included."""
        return LogPosition(seq=self._seq, chain=self._chain.hex())

    @property
    def durable_seq(self) -> int:
        """Records written and fsynced so far."""
        return self._file_seq

    async def durable(self, seq: int) -> None:
        """Wait until the records before `seq` are written and fsynced (group commit).

        One batch is in flight at a time and holds every record appended before it started; records appended
        while it runs go into the next one. A write error is raised to the waiters whose records were in the
        failed batch; the records stay buffered and the next `durable` writes them again.
        """
        self._check_open()
        if seq > self._seq:
            raise ValueError(f"seq {seq} is past the end of the journal ({self._seq} records appended)")
        while self._file_seq < seq:
            flight = self._flight
            if flight is None:
                flight = self._start_flight()
            covers = self._flight_end >= seq
            try:
                # Shielded: a cancelled waiter must not cancel the batch the others wait for.
                await asyncio.shield(flight)
            except Exception:
                if covers:
                    raise
                # Another batch failed; ours was not in it and goes into the next one.

    def _start_flight(self) -> asyncio.Task[None]:
        batch = self._take_batch()
        if not batch.records:
            raise RuntimeError(f"{self.directory}: nothing to write, yet only {self._file_seq} of {self._seq} "
                               f"records are durable")
        self._flight_end = batch.end
        self._flight = asyncio.get_running_loop().create_task(self._run_flight(batch))
        return self._flight

    async def _run_flight(self, batch: _Batch) -> None:
        try:
            await asyncio.to_thread(self._write_batch, batch)
        except BaseException:
            # Kept for the next batch. If we were cancelled the thread may still finish this one: the writer
            # skips records already on disk, so nothing is written twice.
            self._requeue(batch)
            raise
        finally:
            self._flight = None

    def _take_batch(self) -> _Batch:
        batch = _Batch(first=self._pending_first, records=self._pending, end=self._seq, end_chain=self._chain)
        self._pending, self._pending_first = [], self._seq
        return batch

    def _requeue(self, batch: _Batch) -> None:
        self._pending = batch.records + self._pending
        self._pending_first = batch.first

    def _write_batch(self, batch: _Batch) -> None:
        """Write and fsync one batch (in a worker thread); on failure the file is cut back to before it."""
        with self._io_lock:
            if self._fd is None:
                raise ValueError(f"{self.directory}: the journal was closed")
            skip = self._file_seq - batch.first
            if skip < 0:
                raise RuntimeError(f"{self.directory}: a batch starting at seq {batch.first} would leave a gap "
                                   f"after the {self._file_seq} durable records")
            if skip >= len(batch.records):
                return
            if self._needs_cut:
                self._cut_back()
            # Rotation only between batches, and never out of a segment without a record (its name is taken).
            if self._seg_size >= self._segment_bytes and self._file_seq > self._seg_first:
                self._open_segment()
            data = b"".join(batch.records[skip:])
            try:
                write_all(self._fd, data, self._seg_path)
                # Also after a failed fsync: the kernel may have dropped the dirty pages, so the batch is cut
                # and written again rather than fsynced again.
                os.fsync(self._fd)
            except BaseException:
                self._needs_cut = True
                try:
                    self._cut_back()
                except OSError as err:
                    log.error("%s: could not cut a failed write back to %d bytes (retried before the next "
                              "write): %s", self._seg_path, self._seg_size, err)
                raise
            self._seg_size += len(data)
            self._file_seq, self._file_chain = batch.end, batch.end_chain

    def _cut_back(self) -> None:
        assert self._fd is not None
        os.ftruncate(self._fd, self._seg_size)
        os.lseek(self._fd, self._seg_size, os.SEEK_SET)
        os.fsync(self._fd)
        self._needs_cut = False

    async def sync(self) -> LogPosition:
        """Make everything appended so far durable; returns that position."""
        end = self.position()
        await self.durable(end.seq)
        return end

    def sync_blocking(self) -> LogPosition:
        """`sync` without a loop (shutdown, tests); not while an async batch is in flight."""
        self._check_open()
        if self._flight is not None:
            raise RuntimeError(f"{self.directory}: an async batch is in flight; await sync() instead")
        end = self.position()
        batch = self._take_batch()
        if batch.records:
            try:
                self._write_batch(batch)
            except BaseException:
                self._requeue(batch)
                raise
        return end

    def close(self) -> None:
        """Release the files. Records not yet durable are dropped (call `sync` first to keep them)."""
        if self._closed:
            return
        self._closed = True
        with self._io_lock:  # waits for a batch a cancelled flight left running
            if self._seq > self._file_seq:
                log.warning("%s: closing with %d records appended but never made durable; they are dropped",
                            self.directory, self._seq - self._file_seq)
            self._release()

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        os.close(self._dir_fd)  # drops the directory lock

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.directory}: the journal was closed")

    def __enter__(self) -> SegmentLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _make_private_dirs(directory: Path) -> None:
    """Create `directory` and the parents it lacks, each 0700 (a folder that exists keeps its mode)."""
    missing = []
    for folder in (directory, *directory.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)  # mkdir's mode passes through the umask
