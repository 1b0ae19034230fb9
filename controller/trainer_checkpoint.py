"""Trainer checkpoints: `<run_dir>/checkpoints/step_N/`, made in a staging directory,
fsynced, then renamed into place, so a crash never leaves a partial one that looks done."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from primitives.atomic_files import atomic_write_json, publish_dir, staging_dir

log = logging.getLogger("turnkeep.checkpoint")
STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def published_steps(run_dir: Path) -> list[int]:
    root = checkpoint_root(run_dir)
    if not root.exists():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := STEP_DIR.match(p.name)))


async def write_trainer_checkpoint(
    run_dir: Path, step: int, trainer, controller_state: dict[str, Any], keep: int
) -> Path:
    """The trainer writes model, optimizer and RNG; the controller adds its own state."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(root, f"step_{step}")
    try:
        await trainer.save_checkpoint.remote(str(staging / "trainer"))
        atomic_write_json(staging / "controller_state.json", controller_state)
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
        shutil.rmtree(root / f"step_{step}", ignore_errors=True)
