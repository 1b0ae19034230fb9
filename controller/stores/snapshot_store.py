"""Where snapshots live on disk and how one is published.

`<run_dir>/checkpoints/step_N/snapshots/<n>/` holds a published snapshot; its
`manifest.json` is written last, so a directory without one is never read. Attempts
build in `snapshots/.staging-<n>-*`, a name that never looks published.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from turnkeep.primitives.atomic_files import (
    atomic_write_bytes,
    fsync_dir,
    fsync_tree,
    publish_dir,
    remove_dir,
    sha256_file,
    staging_dir,
)
from turnkeep.primitives.snapshot_paths import MANIFEST, NUMBER, snapshots_root
from turnkeep.schemas.participant import Artifact
from turnkeep.schemas.snapshot import SnapshotManifest


def open_staging(run_dir: Path, step: int, number: int) -> Path:
    root = snapshots_root(run_dir, step)
    if not root.parent.exists():
        raise FileNotFoundError(f"trainer checkpoint {root.parent} does not exist; a snapshot must be filed under one")
    root.mkdir(exist_ok=True)
    return staging_dir(root, str(number))


def artifact_for(snapshot_dir: Path, path: Path) -> Artifact:
    return Artifact(path=str(path.relative_to(snapshot_dir)), sha256=sha256_file(path), bytes=path.stat().st_size)


def publish(
    staging: Path, manifest: SnapshotManifest, keep_latest_k: int, before_rename: Callable[[], None] | None = None
) -> tuple[Path, int, list[str]]:
    """fsync the files, write the manifest last, rename into place, prune; returns (dir, bytes, pruned).

    `before_rename` runs when the staging directory is complete but not yet in place
    (where the chaos command kills the run: a complete-looking staging dir is never read).
    Refuses a `keep_latest_k` below 1 before anything is written (it would prune what it publishes).
    """
    _check_keep(keep_latest_k)
    final = staging.parent / str(manifest.number)
    if (final / MANIFEST).exists():
        existing = SnapshotManifest.model_validate_json((final / MANIFEST).read_bytes())
        if existing.checkpoint_id == manifest.checkpoint_id:
            return final, _size(final), []  # a retry after the rename landed
        raise FileExistsError(f"{final} already holds snapshot {existing.checkpoint_id}")
    fsync_tree(staging)
    atomic_write_bytes(staging / MANIFEST, manifest.model_dump_json(indent=2).encode())
    if before_rename is not None:
        before_rename()
    publish_dir(staging, final)
    fsync_dir(final.parent)
    return final, _size(final), prune(final.parent, keep_latest_k)


def published(root: Path) -> list[int]:
    if not root.exists():
        return []
    return sorted(int(p.name) for p in root.iterdir() if NUMBER.match(p.name) and (p / MANIFEST).exists())


def prune(root: Path, keep_latest_k: int) -> list[str]:
    _check_keep(keep_latest_k)
    removed = []
    for number in published(root)[:-keep_latest_k]:
        remove_dir(root / str(number))
        removed.append(str(number))
    return removed


def _check_keep(keep_latest_k: int) -> None:
    if isinstance(keep_latest_k, bool) or not isinstance(keep_latest_k, int) or keep_latest_k < 1:
        raise ValueError(f"keep_latest_k = {keep_latest_k!r}: keep at least 1 published snapshot")


def new_manifest(**fields) -> SnapshotManifest:
    return SnapshotManifest(created_unix_s=time.time(), **fields)


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
