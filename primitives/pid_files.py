"""Which process of a run is which: `<run_dir>/pids/<role>.json`, one file per process.

A pid alone is not an identity (pids are reused), so each file also holds the process's
start tick since boot and the boot id (`primitives.process_identity`); a file whose
process is gone, or whose pid now belongs to another process, names nothing. The wall-clock
create time is written for people and for files of older versions only: it moves when the
wall clock is stepped, so it is never what tells a live process from a gone one when the
start tick is there. Written by whoever starts the process, read by `turnkeep chaos
--target` and by a restart looking for the run's own leftovers.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import psutil

from turnkeep.primitives.atomic_files import atomic_write_json
from turnkeep.primitives.process_identity import ProcessId, boot_id

PIDS_DIR = "pids"
LEGACY_CREATE_TIME_TOLERANCE_S = 1.5
"""For a file without a start tick: the wall clock may have been stepped by a second since it was written."""


def pid_file(run_dir: Path, role: str) -> Path:
    return run_dir / PIDS_DIR / f"{role}.json"


def write_pid_file(run_dir: Path, role: str, pid: int, **serves: str) -> None:
    """`serves`: what the process answers at (an address), so a reader can check it is still that process's."""
    folder = run_dir / PIDS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    process = ProcessId.of(pid)
    if process is None:
        raise psutil.NoSuchProcess(pid, msg=f"the {role} process exited before its pid file was written")
    atomic_write_json(pid_file(run_dir, role), {
        "role": role, "pid": pid, "start_ticks": process.start_ticks, "boot_id": boot_id(),
        "create_time": psutil.Process(pid).create_time(), **serves})


def live_record(run_dir: Path, role: str) -> dict | None:
    """The pid file of the run's `role` process if that very process still runs, else None."""
    try:
        record = orjson.loads(pid_file(run_dir, role).read_bytes())
        return record if _names_a_running_process(record) else None
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return None


def _names_a_running_process(record: dict) -> bool:
    pid = int(record["pid"])
    if "start_ticks" in record:
        return record.get("boot_id") == boot_id() and ProcessId(pid, int(record["start_ticks"])).running()
    process = psutil.Process(pid)
    same = abs(process.create_time() - float(record["create_time"])) < LEGACY_CREATE_TIME_TOLERANCE_S
    return same and process.status() != psutil.STATUS_ZOMBIE


def live_pid(run_dir: Path, role: str) -> int | None:
    """The pid of the run's `role` process if that very process still runs, else None."""
    record = live_record(run_dir, role)
    return None if record is None else int(record["pid"])


def live_pids(run_dir: Path) -> dict[str, int]:
    folder = run_dir / PIDS_DIR
    roles = sorted(path.stem for path in folder.glob("*.json")) if folder.is_dir() else []
    return {role: pid for role in roles if (pid := live_pid(run_dir, role)) is not None}
