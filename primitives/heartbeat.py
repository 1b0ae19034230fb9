"""A process's heartbeat for a watcher on the same machine: `<run_dir>/pids/<role>.beat` holds the monotonic
clock (CLOCK_MONOTONIC, the same in every process of the machine, unmoved by wall-clock steps) of its last beat.

The beat comes from the process's event loop, so a loop blocked in a call that never returns stops it as a
SIGSTOP does; a watcher that reads an old beat from a process that still runs has found a hang, not a death.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from pathlib import Path

from turnkeep.primitives.pid_files import PIDS_DIR

BEAT_EVERY_S = 1.0
LATE_WARN_S = 5.0
"""A beat this much later than due is logged: the loop was blocked that long (what sizes a `hang_s`)."""
_FORMAT = "<d"

log = logging.getLogger("turnkeep.heartbeat")


def beat_file(run_dir: Path, role: str) -> Path:
    return run_dir / PIDS_DIR / f"{role}.beat"


def beat(path: Path) -> None:
    """Record a beat now (one small write; not fsynced: a watcher reads the page cache, and after a machine crash
    there is nobody left to watch)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, struct.pack(_FORMAT, time.monotonic()), 0)
    finally:
        os.close(fd)


def silent_for(path: Path) -> float | None:
    """Seconds since the last beat in `path` (None: no beat there yet)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) != struct.calcsize(_FORMAT):
        return None
    return max(0.0, time.monotonic() - struct.unpack(_FORMAT, raw)[0])


async def beat_forever(path: Path, every_s: float = BEAT_EVERY_S) -> None:
    """Beat every `every_s` from this event loop until cancelled."""
    due = time.monotonic()
    while True:
        late = time.monotonic() - due
        if late > LATE_WARN_S:
            log.warning("this process's event loop was blocked for %.1fs (its heartbeat %s came late)", late, path)
        beat(path)
        due = time.monotonic() + every_s
        await asyncio.sleep(every_s)
