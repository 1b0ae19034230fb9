"""Trainer checkpoints: `<run_dir>/checkpoints/step_N/`, made in a staging directory,
fsynced, then renamed into place, so a crash never leaves a partial one that looks done.

`checkpoint.json` is written last inside the staging directory: it names the run, the
settings and every file's digest, so recovery can tell a checkpoint it may load from a
damaged, foreign or incompatible one.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from turnkeep.primitives.atomic_files import (
    atomic_write_bytes,
    atomic_write_json,
    publish_dir,
    retire_dir,
    sha256_file,
    staging_dir,
)
from turnkeep.primitives.chaos_points import reached
from turnkeep.schemas.participant import Artifact
from turnkeep.schemas.recovery import TrainerCheckpointManifest

log = logging.getLogger("turnkeep.checkpoint")
STEP_DIR = re.compile(r"^step_(\d+)$")
CHECKPOINT_MANIFEST = "checkpoint.json"
CONTROLLER_STATE = "controller_state.json"
TRAINER_STATE = Path("trainer") / "trainer_state.json"
REQUIRED_FILES = (
    "trainer/shards/.metadata",
    "trainer/rng/rank_0.pt",
    str(TRAINER_STATE),
    CONTROLLER_STATE,
)
"""Every checkpoint holds these (paths under `step_N/`) and its manifest lists each of them. The trainer's weights
and AdamW state are a `torch.distributed.checkpoint` folder (`trainer/shards/`): its metadata and one shard file
per rank that wrote it, each listed in the manifest with its digest like every other file."""
SNAPSHOTS = "snapshots"
"""Published after the checkpoint, each with its own manifest: not part of `checkpoint.json`."""


@dataclass(frozen=True)
class CheckpointIdentity:
    """What a checkpoint's manifest records about the run that wrote it."""

    run_id: str
    fingerprint_fields: dict[str, Any] = field(hash=False)


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def published_steps(run_dir: Path) -> list[int]:
    """Published trainer checkpoint steps, oldest first (staging directories never match)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir())


def fingerprint_of(fields: dict[str, Any]) -> str:
    """The same digest as `controller.fingerprint.config_fingerprint`, from the fields alone,
    so a checkpoint written without a config at hand still carries a comparable one."""
    blob = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:16]


def write_checkpoint_manifest(staging: Path, step: int, identity: CheckpointIdentity) -> TrainerCheckpointManifest:
    """Digest every file already in `staging` and write `checkpoint.json` beside them."""
    policy_version = orjson.loads((staging / TRAINER_STATE).read_bytes())["policy_version"]
    artifacts = [
        Artifact(path=str(path.relative_to(staging)), sha256=sha256_file(path), bytes=path.stat().st_size)
        for path in sorted(staging.rglob("*"))
        if path.is_file() and path.relative_to(staging) != Path(CHECKPOINT_MANIFEST)
    ]
    manifest = TrainerCheckpointManifest(
        run_id=identity.run_id,
        step=step,
        policy_version=policy_version,
        config_fingerprint=fingerprint_of(identity.fingerprint_fields),
        fingerprint_fields=identity.fingerprint_fields,
        created_unix_s=time.time(),
        artifacts=artifacts,
    )
    atomic_write_bytes(staging / CHECKPOINT_MANIFEST, manifest.model_dump_json(indent=2).encode())
    return manifest


async def write_trainer_checkpoint(
    run_dir: Path,
    step: int,
    trainer,
    controller_state: dict[str, Any],
    keep: int,
    *,
    identity: CheckpointIdentity | None = None,
    on_published: Callable[[Path], None] | None = None,
) -> Path:
    """The trainer writes model, optimizer and RNG; the controller adds its own state and,
    given an identity, the manifest that recovery verifies. `on_published` runs right after
    the rename, before anything awaits (the controller's journal takes it as its new base).

    All of it goes into a staging directory that is renamed into place only when complete,
    and older checkpoints are pruned only after that: a write that fails (a full disk, a
    trainer error) removes the staging directory and raises, and the previous checkpoint
    stays the newest. A full disk raises `CheckpointDiskFull`, naming the file system, the
    free space and the checkpoint that stays.
    """
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(root, f"step_{step}")
    final = root / f"step_{step}"
    try:
        await trainer.save_checkpoint.remote(str(staging / "trainer"))
        atomic_write_json(staging / CONTROLLER_STATE, controller_state)
        missing = [rel for rel in REQUIRED_FILES if not (staging / rel).is_file()]
        if missing:
            raise IncompleteCheckpoint(
                f"trainer checkpoint step_{step} is incomplete, so it was not published: nothing wrote "
                f"{', '.join(missing)} (the trainer's save_checkpoint must write {', '.join(REQUIRED_FILES[:-1])})"
            )
        await reached("checkpoint_write", run_dir)  # a chaos kill point: every file written, no manifest yet
        if identity is not None:
            write_checkpoint_manifest(staging, step, identity)
        publish_dir(staging, final)
        if on_published is not None:
            on_published(final)
    except BaseException as err:
        disk_full = _disk_full(err, root, staging) if isinstance(err, Exception) else None
        shutil.rmtree(staging, ignore_errors=True)
        if staging.exists():
            log.warning("could not remove the staging directory %s of a failed checkpoint; the next start removes "
                        "it", staging)
        if disk_full is not None:
            raise CheckpointDiskFull(_disk_full_message(run_dir, step, err, *disk_full)) from err
        raise
    await _prune(root, keep)
    log.info("trainer checkpoint written: %s", final)
    return final


class IncompleteCheckpoint(Exception):
    """The trainer left out a file every checkpoint must hold; nothing was published."""


class CheckpointDiskFull(OSError):
    """A trainer checkpoint could not be written for lack of space; nothing was published."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)


_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_NEARLY_FULL_BYTES = 64 << 20


def _disk_full(err: BaseException, root: Path, staging: Path) -> tuple[int, int, bool] | None:
    """(bytes free, bytes staged, certain) when `err` looks like a full disk, else None.

    Certain when an ENOSPC/EDQUOT error is in the chain; likely when the error carries no
    errno (torch.save says only "file write failed") but the file system is nearly full.
    Measured before the staging directory is removed, which frees its space again.
    """
    try:
        stat = os.statvfs(root)
        free = stat.f_bavail * stat.f_frsize
    except OSError:
        free = -1
    try:
        staged = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
    except OSError:
        staged = 0
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if getattr(cause, "errno", None) in _DISK_FULL_ERRNOS or any(
            os.strerror(code) in str(cause) for code in _DISK_FULL_ERRNOS
        ):
            return free, staged, True
        cause = cause.__cause__ or cause.__context__ or getattr(cause, "cause", None)
    if 0 <= free < _NEARLY_FULL_BYTES:
        return free, staged, False
    return None


def _disk_full_message(run_dir: Path, step: int, err: BaseException, free: int, staged: int, certain: bool) -> str:
    steps = published_steps(run_dir)
    stays = f"step_{steps[-1]} stays the newest trainer checkpoint" if steps else "there is no trainer checkpoint yet"
    why = "the disk is full" if certain else "the disk is nearly full, the likely cause"
    free_words = f"{free} bytes free" if free >= 0 else "free space unknown"
    return (
        f"trainer checkpoint step_{step} could not be written in {checkpoint_root(run_dir)}: {why} ({free_words} on "
        f"its file system after {staged} bytes of this checkpoint were written; the error: {err}); its staging "
        f"directory was removed and {stays}. Free space there (or lower train.keep_checkpoints) and restart"
    )


async def _prune(root: Path, keep: int) -> None:
    """Remove all but the newest `keep` checkpoints; only after a new one is published.

    A checkpoint that cannot be removed is kept and reported: the new one is already in
    place, so the write it follows has not failed.
    """
    steps = published_steps(root.parent)
    for step in steps[:-keep]:
        try:
            doomed = retire_dir(root / f"step_{step}")
            await reached("prune", root.parent)  # a chaos kill point: renamed away, its files not deleted yet
            if doomed is not None:
                shutil.rmtree(doomed, ignore_errors=True)
        except OSError as err:
            log.warning("could not prune trainer checkpoint %s (%s); it stays on disk", root / f"step_{step}", err)
