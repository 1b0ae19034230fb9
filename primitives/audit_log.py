"""The audit log writer: lifecycle events as JSON lines, appended and fsynced in batches.

Events are buffered and written by `flush()` in one append on an O_APPEND descriptor,
then fsynced. A background task flushes every `flush_interval_s`; callers that must not
run ahead of the log (a train step about to commit) call `flush()` themselves.

The controller and the environment server share the file. Each flush appends through
`append_lines`, which holds an exclusive `flock` while it appends, so the two never
interleave, and which cuts the file back to its length before the flush when the write or
the fsync fails (ENOSPC, EDQUOT, EIO): a failed write never leaves part of a line behind
for the next one to be appended after. The events stay buffered and the next flush
writes them again. Only a crash in the middle of a write can tear a line, and only the
last one; the next flush cuts such a torn tail off before it appends, and readers skip a
torn last line (a damaged line anywhere else is refused, naming the line).

A full disk loses nothing while there is memory: failed flushes keep every event. The
background flusher reports the first failure of a streak (a warning naming the file and
the errno), retries with backoff up to `retry_max_s`, and says when it writes again.
The buffer is bounded (`max_buffer_bytes`): `emit` cannot block (it runs on the event
loop that also runs the flusher), so at the bound it first tries a flush and, if the
disk still refuses, drops the new event, counts it in `dropped`, and logs an error at
the first drop of a streak and again, with the count, when the log is written again or
closed. Dropped events are the only loss, and never a silent one.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson

from turnkeep.primitives.atomic_files import append_lines, fsync_dir, read_jsonl
from turnkeep.schemas.audit import AUDIT_EVENT
from turnkeep.schemas.rollout import Segment
from turnkeep.schemas.wire import Wire

AUDIT_FILE = "audit.jsonl"
MAX_BUFFER_BYTES = 64 << 20
"""Default bound on events waiting to be written (they wait only while the disk refuses them)."""
RETRY_MAX_S = 5.0
"""Default longest wait between the background flusher's tries while writes fail."""

log = logging.getLogger("turnkeep.audit")


def segments_digest(segments: Iterable[Segment]) -> str:
    """Digest of a conversation's tokens, speakers and policy versions (not its logprobs)."""
    canon = [[s.kind, s.token_ids, s.policy_version] for s in segments]
    return hashlib.sha256(orjson.dumps(canon)).hexdigest()[:24]


def describe_error(err: BaseException) -> str:
    """`[Errno 28] No space left on device (ENOSPC)`: the message with the errno's name."""
    code = getattr(err, "errno", None)
    if isinstance(code, int):
        return f"[Errno {code}] {os.strerror(code)} ({errno.errorcode.get(code, '?')})"
    return f"{type(err).__name__}: {err}"


class AuditLog:
    def __init__(
        self,
        path: Path,
        incarnation: int,
        flush_interval_s: float = 0.2,
        *,
        max_buffer_bytes: int = MAX_BUFFER_BYTES,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self.path = Path(path)
        self.incarnation = incarnation
        self._interval = flush_interval_s
        self._max_buffer_bytes = max_buffer_bytes
        self._retry_max_s = max(retry_max_s, flush_interval_s)
        self._buffer: list[bytes] = []
        self._buffered_bytes = 0
        self.dropped = 0
        """Events refused at the buffer bound over this log's life (see the module docstring)."""
        self._dropped_in_streak = 0
        self._failure: BaseException | None = None  # the error of the current failure streak
        self._failed_since = 0.0
        self._failed_tries = 0
        self._task: asyncio.Task | None = None
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
            fsync_dir(self.path.parent)

    @property
    def pending(self) -> int:
        """Events emitted but not yet written."""
        return len(self._buffer)

    def emit(self, event_cls: type[Wire], **fields) -> None:
        event = event_cls(t=round(time.time(), 4), inc=self.incarnation, **fields)
        line = orjson.dumps(event.model_dump(mode="json"), option=orjson.OPT_APPEND_NEWLINE)
        if self._over_bound(line) and self._failure is None:
            try:
                self.flush()  # backpressure while the disk takes writes: write now rather than grow
            except Exception:  # reported by flush; the bound decides below
                pass
        if self._over_bound(line):
            self._drop(event_cls)
            return
        self._buffer.append(line)
        self._buffered_bytes += len(line)

    def _over_bound(self, line: bytes) -> bool:
        # An empty buffer takes any one event, however large.
        return bool(self._buffer) and self._buffered_bytes + len(line) > self._max_buffer_bytes

    def flush(self) -> None:
        """Write every buffered event durably, or raise and keep them all buffered."""
        if not self._buffer:
            return
        pending, self._buffer = self._buffer, []
        data = b"".join(pending)
        try:
            append_lines(self.path, data, durable=True)
        except BaseException as err:
            self._buffer[:0] = pending  # nothing was written: all of it waits for the next flush
            if isinstance(err, Exception):
                self._note_failure(err)
            raise
        self._buffered_bytes -= len(data)
        if self._failure is not None:
            self._note_recovery(len(pending))

    def _note_failure(self, err: BaseException) -> None:
        self._failed_tries += 1
        same = self._failure is not None and getattr(self._failure, "errno", None) == getattr(err, "errno", None)
        if self._failure is None:
            self._failed_since = time.monotonic()
        self._failure = err
        if not same:  # once per streak (and again if the error changes), not once per retry
            log.warning("audit log %s: write failed: %s; %d events (%d bytes) stay buffered and are retried "
                        "with backoff (up to every %.1f s)", self.path, describe_error(err), len(self._buffer),
                        self._buffered_bytes, self._retry_max_s)

    def _note_recovery(self, written: int) -> None:
        tries = self._failed_tries
        log.warning("audit log %s: written again after %d failed %s over %.1f s; %d buffered events written",
                    self.path, tries, "try" if tries == 1 else "tries", time.monotonic() - self._failed_since, written)
        self._report_dropped()
        self._failure, self._failed_tries = None, 0

    def _drop(self, event_cls: type[Wire]) -> None:
        self.dropped += 1
        self._dropped_in_streak += 1
        if self._dropped_in_streak == 1:
            why = describe_error(self._failure) if self._failure is not None else "no write has failed"
            log.error("audit log %s: %d bytes of events wait to be written (the bound; last error: %s); new events "
                      "are dropped and counted until it is written again (first dropped: %s)", self.path,
                      self._buffered_bytes, why, getattr(event_cls, "__name__", event_cls))

    def _report_dropped(self) -> None:
        if self._dropped_in_streak:
            log.error("audit log %s: %d events were dropped (not written) while it could not be written "
                      "(%d in all so far)", self.path, self._dropped_in_streak, self.dropped)
            self._dropped_in_streak = 0

    def start(self) -> None:
        """Flush in the background until `close()`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._flush_forever(), name="audit-flush")

    async def _flush_forever(self) -> None:
        delay = self._interval
        while True:
            await asyncio.sleep(delay)
            # On the event loop, never a thread: lines keep their order and no emit races the buffer swap.
            try:
                self.flush()
            except Exception:  # flush reported it (once per streak) and kept the events
                delay = min(max(delay, self._interval, 0.05) * 2, self._retry_max_s)
            else:
                delay = self._interval

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            self.flush()
        except Exception as err:
            log.error("audit log %s: closing with %d events that could not be written (%s); they are lost",
                      self.path, len(self._buffer), describe_error(err))
            self._report_dropped()
            raise
        self._report_dropped()


def read_audit(run_dir: Path) -> Iterator:
    """Every event of `<run_dir>/audit.jsonl` as its typed model, in file order.

    A torn last line (a crash mid-write) is skipped; a damaged line before the end raises
    `ValueError` naming the line.
    """
    path = Path(run_dir) / AUDIT_FILE
    if not path.exists():
        return
    for raw in read_jsonl(path):
        yield AUDIT_EVENT.validate_python(raw)
