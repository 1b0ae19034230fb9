"""The names of a run's snapshot directories, which the controller and an engine's own Temporal worker both read.

`<run_dir>/checkpoints/step_N/snapshots/<n>/` holds a published snapshot; its `manifest.json` is written last, so a
directory without one is never read. Attempts build in `snapshots/.staging-<n>-*`, a name that never looks
published (`controller.stores.snapshot_store` makes and publishes them).
"""

from __future__ import annotations

import re
from pathlib import Path

from turnkeep.primitives.atomic_files import STAGING_PREFIX

MANIFEST = "manifest.json"
NUMBER = re.compile(r"^\d+$")
STAGING_NAME = re.compile(rf"{re.escape(STAGING_PREFIX)}([0-9]+)-[0-9a-f]+")
"""An attempt's staging directory as `open_staging` names it: `.staging-<n>-<random hex>`."""


def staging_number(name: str) -> int | None:
    """The attempt number in a staging directory's name; None for a name `open_staging` never makes."""
    match = STAGING_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def snapshots_root(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step}" / "snapshots"
