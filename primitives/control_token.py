"""The run's control token: a bearer secret for the participants' checkpoint routes.

The environment servers and the policy server accept `/checkpoint/*` calls only with
`Authorization: Bearer <token>`, so another user (or a stray script) on the same
machine cannot park every agent or fence the policy server. The token lives in
`<run_dir>/control_token` with mode 0600: whoever can read the run directory's secrets
can drive the run, nobody else. A restarted run keeps its token, so participants
started by the previous incarnation and the new coordinator agree.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from turnkeep.primitives.atomic_files import TMP_PREFIX, PathLike, fsync_dir

TOKEN_FILE = "control_token"


class ControlTokenError(RuntimeError):
    """The token file is missing, empty or readable by others."""


def token_path(run_dir: PathLike) -> Path:
    return Path(run_dir) / TOKEN_FILE


def create_control_token(run_dir: PathLike) -> str:
    """Return the run's token, creating `<run_dir>/control_token` (mode 0600) if absent."""
    return create_token_file(token_path(run_dir))


def read_control_token(run_dir: PathLike) -> str:
    """The run's token; refuses a token file that others can read."""
    return read_token_file(token_path(run_dir), "the run creates it when it starts its processes")


def create_token_file(path: Path) -> str:
    """Return the token in `path`, creating it (a new random token, mode 0600) if absent."""
    if path.exists():
        return read_token_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{secrets.token_hex(6)}")
    # 0600 from the first byte: the secret is never readable by others, not even briefly.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (secrets.token_urlsafe(32) + "\n").encode())
        os.fsync(fd)
        os.close(fd)
        fd = -1
        # link, not replace: if two starters race, the first token wins and both read it.
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        fsync_dir(path.parent)
    finally:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
    return read_token_file(path)


def read_token_file(path: Path, how_made: str = "create it with a random secret, mode 0600") -> str:
    """The token in `path`; refuses a missing or empty file, or one that others can read."""
    try:
        mode = path.stat().st_mode & 0o777
        token = path.read_text().strip()
    except FileNotFoundError:
        raise ControlTokenError(f"{path} does not exist; {how_made}") from None
    except IsADirectoryError:
        raise ControlTokenError(f"{path} is a directory; give the path of the token file") from None
    if mode & 0o077:
        raise ControlTokenError(f"{path} has mode {mode:o}; it must be readable by its owner only (chmod 600 {path})")
    if not token:
        raise ControlTokenError(f"{path} is empty; delete it and start again to make a new token")
    return token
