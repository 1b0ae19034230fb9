"""A run directory's identity: a new run, or the next incarnation of one that was stopped.

`run.json` holds the run id and the controller incarnation. A directory that holds
one is resumed (incarnation + 1, written before anything else starts) unless its
checkpoints were written with other settings; an empty or missing directory starts a
new run; anything else is refused untouched.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import orjson

from turnkeep.controller.fingerprint import fingerprint_fields
from turnkeep.controller.restore.unusable import refuse_config_change
from turnkeep.primitives.atomic_files import atomic_write_json
from turnkeep.schemas.config import TurnkeepConfig

RUN_FILE = "run.json"


class RunDirError(ValueError):
    """The run directory can neither start a new run nor resume one."""


@dataclass(frozen=True)
class RunIdentity:
    run_id: str
    incarnation: int
    resumed: bool


PRIVATE_UMASK = 0o077
"""Everything the run and its child processes create is readable by the run's user only."""


def open_run_dir(cfg: TurnkeepConfig) -> RunIdentity:
    # Before anything is written or started: Temporal's database, Ray's session files,
    # checkpoints and snapshots inherit it (0700 directories, 0600 files).
    os.umask(PRIVATE_UMASK)
    run_dir = cfg.run.run_dir
    run_file = run_dir / RUN_FILE
    if run_file.exists():
        try:
            previous = orjson.loads(run_file.read_bytes())
            run_id, incarnation = str(previous["run_id"]), int(previous["incarnation"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise RunDirError(
                f"{run_file} is damaged ({err}); nothing was touched. It must hold "
                '{"run_id": ..., "incarnation": ...}; restore it or start a new run with another --run-dir.'
            ) from None
        # A settings change that no checkpoint fits is refused before anything is written.
        refuse_config_change(run_dir, fingerprint_fields(cfg))
        run_dir.chmod(0o700)
        identity = RunIdentity(run_id, incarnation + 1, resumed=True)
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise RunDirError(
            f"run directory {run_dir} is not empty and holds no turnkeep run ({RUN_FILE} is missing); "
            "nothing in it was touched. Pick another run.run_dir (--run-dir) or empty it."
        )
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        identity = RunIdentity(f"{run_dir.name}-{uuid.uuid4().hex[:6]}", 1, resumed=False)
        atomic_write_json(run_dir / "config.json", cfg.model_dump(mode="json"))
    if identity.resumed:
        # The first incarnation's config.json stays; each restart records what it ran with.
        atomic_write_json(run_dir / f"config.{identity.incarnation}.json", cfg.model_dump(mode="json"))
    atomic_write_json(run_file, {"run_id": identity.run_id, "incarnation": identity.incarnation})
    return identity
