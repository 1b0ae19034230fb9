"""Durable file writes: a crash at any moment leaves either the old file or the new one.

Invariant 3 (a crash leaves the newest published snapshot intact; a partial one is
never read) rests on these helpers. Files are written to a temporary name in the
same directory, flushed and fsynced, renamed over the target with `os.replace`, and
then the directory is fsynced so the rename itself survives a power loss.
Directories are built under a `.staging-` name and renamed into place only when
complete; readers skip every name that starts with `.staging-`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

STAGING_PREFIX = ".staging-"
TMP_PREFIX = ".tmp-"

PathLike = str | os.PathLike[str]
_TAIL_CHUNK = 64 << 10

log = logging.getLogger("turnkeep.files")


def write_all(fd: int, data: bytes, path: PathLike) -> None:
    """os.write until every byte is written; a write that makes no progress is a full disk."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        view = view[written:]


def fsync_dir(path: PathLike) -> None:
    """fsync a directory so renames and new entries in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    target = Path(path)
    tmp = target.with_name(f"{TMP_PREFIX}{target.name}-{secrets.token_hex(6)}")
    # os.open with mode 0o666 honours the umask, unlike mkstemp's fixed 0o600.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> None:
    """Replace `path` with `text` atomically and durably."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: PathLike, obj: Any, *, indent: bool = True) -> None:
    """Replace `path` with `obj` as JSON (orjson, sorted keys) atomically and durably.

    Keys are sorted so the same object always gives the same bytes (and digest).
    Pydantic models must be dumped first (`model.model_dump(mode="json")`).
    """
    option = orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
    if indent:
        option |= orjson.OPT_INDENT_2
    atomic_write_bytes(path, orjson.dumps(obj, option=option))


def fsync_tree(root: PathLike) -> None:
    """fsync every regular file and directory under `root` (and `root` itself)."""
    # Bottom-up, so each directory is synced after the entries inside it.
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            file_path = os.path.join(dirpath, name)
            if os.path.islink(file_path) or not os.path.isfile(file_path):
                continue
            fd = os.open(file_path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def is_staging_name(name: str) -> bool:
    """True for names that are never published: staging dirs and temp files."""
    return name.startswith(STAGING_PREFIX) or name.startswith(TMP_PREFIX)


def staging_dir(parent: PathLike, name: str) -> Path:
    """Create and return a fresh `<parent>/.staging-<name>-<random>` directory."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"staging name must be a plain file name, got {name!r}")
    parent_path = Path(parent)
    parent_path.mkdir(parents=True, exist_ok=True)
    path = parent_path / f"{STAGING_PREFIX}{name}-{secrets.token_hex(6)}"
    path.mkdir()
    return path


def publish_dir(staging: PathLike, final: PathLike) -> None:
    """Make the complete directory `staging` visible as `final`, durably.

    Refuses (FileExistsError) when `final` exists: on Linux a rename onto an empty
    directory would silently replace it, and a published directory is never
    overwritten. The check and the rename are not one atomic step, so only one
    publisher may target `final` at a time (the snapshot attempt's checkpoint id
    guarantees that).
    """
    staging_path, final_path = Path(staging), Path(final)
    if not staging_path.is_dir():
        raise FileNotFoundError(f"staging directory {staging_path} does not exist")
    if final_path.exists() or final_path.is_symlink():
        raise FileExistsError(f"refusing to publish {staging_path} as {final_path}: target already exists")
    fsync_tree(staging_path)
    os.rename(staging_path, final_path)
    fsync_dir(final_path.parent)
    if staging_path.parent.resolve() != final_path.parent.resolve():
        fsync_dir(staging_path.parent)


def remove_stale_staging(parent: PathLike) -> list[Path]:
    """Delete staging directories and temp files left in `parent` by a crash.

    Call it only when nothing is writing into `parent` (at startup or recovery):
    a live writer's staging directory looks exactly like a stale one. Returns the
    paths removed.
    """
    parent_path = Path(parent)
    if not parent_path.is_dir():
        return []
    removed: list[Path] = []
    for entry in sorted(parent_path.iterdir()):
        if not is_staging_name(entry.name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    if removed:
        fsync_dir(parent_path)
    return removed


def append_lines(path: PathLike, data: bytes, *, durable: bool = True) -> None:
    """Append whole lines (`data` ends with a newline) to `path`, all of them or none.

    The append holds an exclusive `flock` on the file, so writers that all append through
    here never interleave, and nobody appends between a failed write and its undoing: when
    the write or the fsync fails (a full disk: ENOSPC, EDQUOT; EIO), the file is cut back
    to the length it had before, and the error is raised. So a failed append never leaves
    part of a line for the next append to follow; only a crash mid-write can tear a line,
    and only the last one, which the next append cuts off first (and `read_jsonl` skips).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by close
        start = _cut_torn_tail(fd, path)
        try:
            write_all(fd, data, path)
            if durable:
                os.fsync(fd)
        except BaseException:
            _cut_back(fd, start, path)
            raise
    finally:
        os.close(fd)


def _cut_back(fd: int, length: int, path: PathLike) -> None:
    """Undo a failed append: a short write, or a write whose fsync failed."""
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    except OSError as err:
        # The next append cuts a torn tail off first; whole lines of this one may remain.
        log.error("%s: could not cut a failed append back to %d bytes: %s", path, length, err)


def _cut_torn_tail(fd: int, path: PathLike) -> int:
    """The file's length once a torn last line (a crash mid-write) is cut off."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end, keep = size, 0
    while end > 0:
        begin = max(0, end - _TAIL_CHUNK)
        newline = os.pread(fd, end - begin, begin).rfind(b"\n")
        if newline >= 0:
            keep = begin + newline + 1
            break
        end = begin
    log.warning("%s ends in a torn line (%d bytes without a newline, left by a crash mid-write); cutting it off "
                "before appending", path, size - keep)
    os.ftruncate(fd, keep)
    return keep


def append_jsonl(path: PathLike, obj: Any, *, durable: bool = False) -> None:
    """Append `obj` as one JSON line; with `durable`, fsync before returning.

    Through `append_lines`: a failed append (a full disk) leaves the file as it was, and a
    crash can tear only the last line, which `read_jsonl` skips.
    """
    target = Path(path)
    created = not target.exists()
    append_lines(target, orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE), durable=durable)
    if durable and created:
        # A new file's directory entry is not durable until its directory is synced.
        fsync_dir(target.parent)


class DamagedJsonl(ValueError):
    """A line before the end of a JSON-lines file is not JSON: the file is damaged, not just torn."""


def read_jsonl(path: PathLike) -> Iterator[Any]:
    """Yield each JSON line of `path`, skipping a torn (unterminated) final line.

    Only the last line can be torn by a crash mid-append; a terminated line that is not
    JSON raises `DamagedJsonl` naming the file, the line and its byte offset.
    """
    with open(path, "rb") as f:
        offset = 0
        for number, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
                # Only the last line can lack its newline: a crash mid-append.
                return
            if raw.strip():
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError as err:
                    raise DamagedJsonl(
                        f"{path} line {number} (byte {offset}) is not valid JSON ({err}): a torn or damaged line "
                        f"before the end of the file, which a crash alone cannot leave; the file is damaged "
                        f"(the line starts {bytes(raw[:80])!r})"
                    ) from None
                yield obj
            offset += len(raw)


def sha256_file(path: PathLike, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def remove_dir(path: PathLike) -> None:
    """Remove a published directory so that a crash midway never leaves half of it under its name.

    It is first renamed to a staging name (never read, cleaned up on restart), then deleted.
    """
    doomed = retire_dir(path)
    if doomed is not None:
        shutil.rmtree(doomed, ignore_errors=True)


def retire_dir(path: PathLike) -> Path | None:
    """The first half of `remove_dir`: rename it to a staging name, durably; the new path (None: no such dir)."""
    target = Path(path)
    if not target.exists():
        return None
    doomed = target.parent / f"{STAGING_PREFIX}removed-{target.name}-{secrets.token_hex(4)}"
    os.rename(target, doomed)
    fsync_dir(target.parent)
    return doomed
