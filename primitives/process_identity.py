"""A process, not just a pid: the pid with the clock tick it started at, since boot.

The start tick (field 22 of /proc/<pid>/stat) never changes for a process. The wall-clock
create time that psutil derives from it does: it adds /proc/stat's `btime`, which moves
whenever the wall clock is stepped (NTP, a virtual machine resumed), and a 1 s step made
a live trainer look gone. Identities here are therefore start ticks plus the boot id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessId:
    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        stat = process_stat(pid)
        return None if stat is None else cls(pid, stat[1])

    def running(self) -> bool:
        """This very process still runs (a zombie has exited; a reused pid is another process)."""
        stat = process_stat(self.pid)
        return stat is not None and stat[1] == self.start_ticks and stat[0] not in "ZXx"


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) from /proc/<pid>/stat, or None when there is no such pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[0].decode(), int(fields[19])
