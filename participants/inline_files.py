"""Snapshot files of a participant on another machine travel inside its HTTP calls.

A stand-alone environment server cannot write into the coordinator's staging folder, so
an inline commit answers with its files (base64), and the coordinator checks each one
against the digest the participant computed before writing it durably into the
snapshot; a restore sends the folder's files back the same way. Plain file names only:
a name cannot point outside the folder.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path, PurePosixPath

from turnkeep.primitives.atomic_files import atomic_write_bytes, fsync_dir
from turnkeep.schemas.participant import Artifact


class InlineFilesError(ValueError):
    """Inline files that do not match their manifest, or a name that is not a plain file name."""


def pack_artifacts(name: str, folder: Path, artifacts: list[Artifact]) -> dict[str, str]:
    """The committed files of participant `name` (in `folder`), by their name inside it."""
    return {_plain(_inside(name, a.path)): _encode((folder / _inside(name, a.path)).read_bytes()) for a in artifacts}


def write_artifacts(name: str, directory: Path, files: dict[str, str], artifacts: list[Artifact]) -> None:
    """Check each file against its artifact's digest and size, then write it durably into `directory`."""
    listed = {_plain(_inside(name, a.path)): a for a in artifacts}
    if set(listed) != set(files):
        raise InlineFilesError(f"{name}: inline files {sorted(files)} do not match its artifacts {sorted(listed)}")
    directory.mkdir(parents=True, exist_ok=True)
    for file_name, encoded in files.items():
        data = base64.b64decode(encoded, validate=True)
        artifact = listed[file_name]
        if hashlib.sha256(data).hexdigest() != artifact.sha256 or len(data) != artifact.bytes:
            raise InlineFilesError(f"{name}: inline file {file_name} does not match its sha256/size in the manifest")
        atomic_write_bytes(directory / file_name, data)
    fsync_dir(directory)
    fsync_dir(directory.parent)


def pack_folder(folder: Path) -> dict[str, str]:
    """Every plain file of a participant's snapshot folder, for an inline restore."""
    return {p.name: _encode(p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()}


def unpack_into(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for file_name, encoded in files.items():
        (folder / _plain(file_name)).write_bytes(base64.b64decode(encoded, validate=True))


def _inside(name: str, artifact_path: str) -> str:
    path = PurePosixPath(artifact_path)
    if path.parts[:1] != (name,):
        raise InlineFilesError(f"artifact {artifact_path!r} is not inside the participant's folder {name}/")
    return str(PurePosixPath(*path.parts[1:]))


def _plain(file_name: str) -> str:
    if not file_name or "/" in file_name or "\\" in file_name or file_name in (".", "..") or "\0" in file_name:
        raise InlineFilesError(f"inline file name {file_name!r} must be a plain file name")
    return file_name


def _encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
