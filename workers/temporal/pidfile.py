"""Which process is a run directory's embedded Temporal dev server: `<run_dir>/pids/temporal.json`.

A controller killed alone (the OOM killer) leaves its dev server running in its own
session. The record lets the next start on the same run directory find that server and
tell it apart from a process that merely got its pid later: it holds the pid with the
process's start time (field 22 of /proc/<pid>/stat, clock ticks since boot) and the
boot id, and the process's command line must still be `temporal server start-dev
--db-filename <run_dir>/temporal.db`. Only a process that passes all three is ever
signalled, and the signal goes through a pidfd opened before the last check, so a pid
reused in between is never hit.

The file sits with the run's other pid files (`primitives.pid_files`: role, pid,
start_ticks, boot_id), so `turnkeep chaos --target temporal` finds the server the same way; the
ports, the database and the owning controller are extra fields.
"""

from __future__ import annotations

import os
import select
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from turnkeep.primitives.atomic_files import atomic_write_json
from turnkeep.primitives.pid_files import PIDS_DIR, pid_file
from turnkeep.primitives.process_identity import ProcessId, boot_id, process_stat

ROLE = "temporal"
KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class ServerRecord:
    pid: int
    start_ticks: int
    boot_id: str
    owner_pid: int
    """The controller that runs this server now (a controller that takes a server over becomes its owner)."""
    owner_start_ticks: int
    address: str
    ip: str
    port: int
    ui_port: int
    ui_url: str
    db: str
    namespace: str

    @property
    def server(self) -> ProcessId:
        return ProcessId(self.pid, self.start_ticks)

    @property
    def owner(self) -> ProcessId:
        return ProcessId(self.owner_pid, self.owner_start_ticks)

    def names_server_on(self, db: Path) -> bool:
        """The pid is still the dev server this record was written for, on `db`."""
        return self.boot_id == boot_id() and self.server.running() and is_dev_server_on(self.pid, db)


def record_path(run_dir: Path) -> Path:
    return pid_file(run_dir, ROLE)


def write_record(run_dir: Path, record: ServerRecord) -> None:
    """Atomically, readable by the run's user only."""
    folder = run_dir / PIDS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    path = record_path(run_dir)
    atomic_write_json(path, {"role": ROLE, **asdict(record)})
    path.chmod(0o600)


def read_record(run_dir: Path) -> ServerRecord | None:
    """The record, or None when there is none; a damaged one is removed (it names nothing usable)."""
    path = record_path(run_dir)
    try:
        data = orjson.loads(path.read_bytes())
        fields = {name: data[name] for name in ServerRecord.__dataclass_fields__}
        return ServerRecord(**fields)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return None


def remove_record(run_dir: Path, pid: int | None = None) -> None:
    """Remove the record (only if it still names `pid`, when given)."""
    if pid is not None:
        record = read_record(run_dir)
        if record is None or record.pid != pid:
            return
    record_path(run_dir).unlink(missing_ok=True)


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_dev_server_on(pid: int, db: Path) -> bool:
    """`pid` runs `temporal server start-dev --db-filename <db>`."""
    args = cmdline(pid)
    if len(args) < 3 or not Path(args[0]).name.startswith("temporal") or args[1:3] != ["server", "start-dev"]:
        return False
    try:
        value = args[args.index("--db-filename") + 1]
    except (ValueError, IndexError):
        return False
    return os.path.realpath(value) == os.path.realpath(db)


def servers_on(db: Path) -> list[ProcessId]:
    """Every live dev server on `db`, named in a record or not."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and is_dev_server_on(int(entry), db):
            process = ProcessId.of(int(entry))
            if process is not None and process.running():
                found.append(process)
    return found


def terminate(process: ProcessId, grace_s: float) -> bool:
    """SIGTERM, then SIGKILL after `grace_s`; returns once all its threads are gone (its sockets closed).

    False when it was not running (gone, exiting, or the pid is another process's now).
    """
    try:
        fd = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return False
    try:
        # Checked after the pidfd pins the pid: from here on it cannot become another process's.
        stat = process_stat(process.pid)
        if stat is None or stat[1] != process.start_ticks:
            return False
        if stat[0] in "ZXx":  # exiting: its other threads may still hold its sockets for a moment
            _exited(fd, KILL_WAIT_S)
            return False
        _signal(fd, signal.SIGTERM)
        if not _exited(fd, grace_s):
            _signal(fd, signal.SIGKILL)
            _exited(fd, KILL_WAIT_S)
        return True
    finally:
        os.close(fd)


def _signal(fd: int, signum: int) -> None:
    try:
        signal.pidfd_send_signal(fd, signum)
    except ProcessLookupError:
        pass


def _exited(fd: int, timeout_s: float) -> bool:
    """A pidfd turns readable once every thread of the process has exited, reaped by its parent or not."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))
