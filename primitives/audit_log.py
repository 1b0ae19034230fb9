"""The audit log writer: lifecycle events as JSON lines, appended and fsynced in batches.

Events are buffered and written by `flush()` in one `write` on an O_APPEND descriptor
(so the controller and the environment server can share the file without interleaving
lines), then fsynced. A background task flushes every `flush_interval_s`; callers that
must not run ahead of the log (a train step about to commit) call `flush()` themselves.
A crash can lose at most the unflushed tail and tear the last line; readers skip a torn
line.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson

from primitives.atomic_files import fsync_dir, read_jsonl
from schemas.audit import AUDIT_EVENT
from schemas.rollout import Segment
from schemas.wire import Wire

AUDIT_FILE = "audit.jsonl"


def segments_digest(segments: Iterable[Segment]) -> str:
    """Digest of a conversation's tokens, speakers and policy versions (not its logprobs)."""
    canon = [[s.kind, s.token_ids, s.policy_version] for s in segments]
    return hashlib.sha256(orjson.dumps(canon)).hexdigest()[:24]


class AuditLog:
    def __init__(self, path: Path, incarnation: int, flush_interval_s: float = 0.2) -> None:
        self.path = Path(path)
        self.incarnation = incarnation
        self._interval = flush_interval_s
        self._buffer: list[bytes] = []
        self._task: asyncio.Task | None = None
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
            fsync_dir(self.path.parent)

    def emit(self, event_cls: type[Wire], **fields) -> None:
        event = event_cls(t=round(time.time(), 4), inc=self.incarnation, **fields)
        self._buffer.append(orjson.dumps(event.model_dump(mode="json"), option=orjson.OPT_APPEND_NEWLINE))

    def flush(self) -> None:
        if not self._buffer:
            return
        data, self._buffer = b"".join(self._buffer), []
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def start(self) -> None:
        """Flush in the background until `close()`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._flush_forever(), name="audit-flush")

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            # On the event loop, never a thread: lines keep their order and no emit races the buffer swap.
            self.flush()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.flush()


def read_audit(run_dir: Path) -> Iterator:
    """Every event of `<run_dir>/audit.jsonl` as its typed model, in file order."""
    path = Path(run_dir) / AUDIT_FILE
    if not path.exists():
        return
    for raw in read_jsonl(path):
        yield AUDIT_EVENT.validate_python(raw)
