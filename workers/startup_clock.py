"""Where an incarnation's start goes: each piece's moment of being up, in seconds from the controller process's own
start (the interpreter and its imports included), as one `startup` line of metrics.jsonl and one log line.

`turnkeep bench restart` reads it to split a restart into its phases; a user reads the log line to see whether Ray,
Temporal, the trainer, the engines or the recovery took the time.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import psutil

from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.schemas.choices import MetricsKind

log = logging.getLogger("turnkeep.run")


class StartupClock:
    def __init__(self, began_unix_s: float | None = None) -> None:
        self.began_unix_s = began_unix_s if began_unix_s is not None else process_start_unix_s()
        self.marks: dict[str, float] = {}
        """Phase -> seconds from the process's start, in the order they were marked (the first mark of each)."""

    def mark(self, phase: str) -> None:
        self.marks.setdefault(phase, round(time.time() - self.began_unix_s, 3))

    def record(self, run_dir: Path, incarnation: int) -> None:
        append_jsonl(run_dir / "metrics.jsonl", {
            "kind": MetricsKind.STARTUP, "t": round(time.time(), 3), "incarnation": incarnation,
            "process_start_unix_s": round(self.began_unix_s, 3), "seconds": self.marks}, durable=False)
        log.info("started in %.1fs: %s", max(self.marks.values(), default=0.0),
                 ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in self.marks.items()))


def process_start_unix_s() -> float:
    """This process's start on the wall clock, to the kernel's tick. psutil's `create_time` adds the boot time, which
    the kernel gives in whole seconds: up to a second off, which a split of a 20-second start cannot take."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        since_boot_s = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, `starttime`
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot_s)
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return psutil.Process().create_time()


async def marked(clock: StartupClock | None, phase: str, awaitable):
    """`await awaitable`, marking `phase` on `clock` (when there is one) the moment it is done."""
    result = await awaitable
    if clock is not None:
        clock.mark(phase)
    return result
