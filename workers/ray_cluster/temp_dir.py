"""Where the run's local Ray keeps its session: `<run_dir>/ray`, or a short folder of the run's own when that
path is too deep for Ray's unix sockets.

Ray puts its sockets at `<temp_dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store`, and a unix socket
path has at most 107 bytes: under `<run_dir>/ray`, a run directory of about 40 characters is the deepest that fits.
A deeper run directory gets `<system temp dir>/turnkeep-ray-<uid>/<hash of the run directory>` (0700, the same
folder every time for the same run directory, so a restarted controller finds its Ray again), and `<run_dir>/ray`
links to it, where a user looks for Ray's logs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from turnkeep.config.loader import ConfigError

UNIX_PATH_MAX = 107
"""Bytes in a unix socket path (sun_path holds 108 with its terminating NUL)."""
LONGEST_SOCKET_UNDER = len("/session_2026-12-05_04-35-03_311162_4194304/sockets/plasma_store")
"""What Ray appends to its temp dir for its longest socket path (a pid of up to seven digits)."""


def fits(temp_dir: Path) -> bool:
    return len(os.fsencode(temp_dir)) + LONGEST_SOCKET_UNDER <= UNIX_PATH_MAX


def ray_temp_dir(run_dir: Path) -> Path:
    """The run's Ray temp dir (nothing is made); ConfigError, naming both paths, when even the short one is too
    long."""
    in_run_dir = Path(run_dir).resolve() / "ray"
    if fits(in_run_dir):
        return in_run_dir
    digest = hashlib.sha256(os.fsencode(in_run_dir)).hexdigest()[:12]
    short = Path(tempfile.gettempdir()) / f"turnkeep-ray-{os.getuid()}" / digest
    if not fits(short):
        raise ConfigError(
            f"run.run_dir = {run_dir}: Ray's sockets under {in_run_dir} would pass the {UNIX_PATH_MAX}-byte unix "
            f"path limit, and so would they under the system temp dir ({short}); pick a run directory of at most "
            f"{UNIX_PATH_MAX - LONGEST_SOCKET_UNDER - len('/ray')} characters, or set TMPDIR to a short folder")
    return short


def prepare_ray_temp_dir(run_dir: Path) -> Path:
    """Make the run's Ray temp dir (0700) and, when it is not `<run_dir>/ray`, link `<run_dir>/ray` to it."""
    temp_dir = ray_temp_dir(run_dir)
    in_run_dir = Path(run_dir).resolve() / "ray"
    if temp_dir == in_run_dir:
        temp_dir.mkdir(mode=0o700, exist_ok=True)
        return temp_dir
    temp_dir.parent.mkdir(mode=0o700, exist_ok=True)  # the user's folder under the shared temp dir
    temp_dir.mkdir(mode=0o700, exist_ok=True)
    if not in_run_dir.is_symlink() and not in_run_dir.exists():
        in_run_dir.symlink_to(temp_dir, target_is_directory=True)
    return temp_dir
