"""Trainer checkpoints: `<run_dir>/checkpoints/step_N/`, made in a staging directory,
fsynced, then renamed into place, so a crash never leaves a partial one that looks done.

`checkpoint.json` is written last inside the staging directory: it names the run, the
settings and every file's digest, so recovery can tell a checkpoint it may load from a
damaged, foreign or incompatible one.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from primitives.atomic_files import (
    atomic_write_bytes,
    atomic_write_json,
    publish_dir,
    remove_dir,
    sha256_file,
    staging_dir,
)
from schemas.participant import Artifact
from schemas.recovery import TrainerCheckpointManifest

log = logging.getLogger("turnkeep.checkpoint")
STEP_DIR = re.compile(r"^step_(\d+)$")
CHECKPOINT_MANIFEST = "checkpoint.json"
CONTROLLER_STATE = "controller_state.json"
TRAINER_STATE = Path("trainer") / "trainer_state.json"


@dataclass(frozen=True)
class CheckpointIdentity:
    """What a checkpoint's manifest records about the run that wrote it."""

    run_id: str
    fingerprint_fields: dict[str, Any] = field(hash=False)


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def published_steps(run_dir: Path) -> list[int]:
    root = checkpoint_root(run_dir)
    if not root.exists():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := STEP_DIR.match(p.name)))


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
) -> Path:
    """The trainer writes model, optimizer and RNG; the controller adds its own state and,
    given an identity, the manifest that recovery verifies."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(root, f"step_{step}")
    try:
        await trainer.save_checkpoint.remote(str(staging / "trainer"))
        atomic_write_json(staging / CONTROLLER_STATE, controller_state)
        if identity is not None:
            write_checkpoint_manifest(staging, step, identity)
        final = root / f"step_{step}"
        publish_dir(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _prune(root, keep)
    log.info("trainer checkpoint written: %s", final)
    return final


def _prune(root: Path, keep: int) -> None:
    steps = published_steps(root.parent)
    for step in steps[:-keep]:
        remove_dir(root / f"step_{step}")
