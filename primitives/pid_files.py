"""Which process of a run is which: `<run_dir>/pids/<role>.json`, one file per process.

A pid alone is not an identity (pids are reused), so each file also holds the
process's creation time; a file whose process is gone, or whose pid now belongs to
another process, names nothing. Written by whoever starts the process, read by
`turnkeep chaos --target` and by a restart looking for the run's own leftovers.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import psutil

from primitives.atomic_files import atomic_write_json

PIDS_DIR = "pids"
CREATE_TIME_TOLERANCE_S = 0.05


def pid_file(run_dir: Path, role: str) -> Path:
    return run_dir / PIDS_DIR / f"{role}.json"


def write_pid_file(run_dir: Path, role: str, pid: int, **serves: str) -> None:
    """`serves`: what the process answers at (an address), so a reader can check it is still that process's."""
    folder = run_dir / PIDS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    atomic_write_json(pid_file(run_dir, role), {"role": role, "pid": pid,
                                                "create_time": psutil.Process(pid).create_time(), **serves})


def live_record(run_dir: Path, role: str) -> dict | None:
    """The pid file of the run's `role` process if that very process still runs, else None."""
    try:
        record = orjson.loads(pid_file(run_dir, role).read_bytes())
        process = psutil.Process(int(record["pid"]))
        same = abs(process.create_time() - float(record["create_time"])) < CREATE_TIME_TOLERANCE_S
        return record if same and process.status() != psutil.STATUS_ZOMBIE else None
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return None


def live_pid(run_dir: Path, role: str) -> int | None:
    """The pid of the run's `role` process if that very process still runs, else None."""
    record = live_record(run_dir, role)
    return None if record is None else int(record["pid"])


def live_pids(run_dir: Path) -> dict[str, int]:
    folder = run_dir / PIDS_DIR
    roles = sorted(path.stem for path in folder.glob("*.json")) if folder.is_dir() else []
    return {role: pid for role in roles if (pid := live_pid(run_dir, role)) is not None}
