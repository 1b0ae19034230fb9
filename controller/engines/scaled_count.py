"""The engine count an operator set with `turnkeep scale`, kept in the run directory so the next start of the same
run (after a crash, a preemption or a stop) comes back with it rather than with the config's.

`<run_dir>/engines.json` holds the count and the config's `policy.engines` it replaced. The config wins when it
changed since: an operator who edits `policy.engines` between starts means the new value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnkeep.primitives.atomic_files import atomic_write_json
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.snapshot import MAX_ENGINES

SCALED_FILE = "engines.json"


class ScaledCount(BaseModel):
    model_config = ConfigDict(extra="forbid")
    engines: int = Field(ge=1, le=MAX_ENGINES)
    config_engines: int = Field(ge=1, le=MAX_ENGINES)
    """`policy.engines` of the config when the run was scaled."""


@dataclass(frozen=True)
class StartCount:
    cfg: TurnkeepConfig
    note: str | None
    """One line for the operator when the count is not the config's, or a kept count was dropped."""


def save_scaled(run_dir: Path, engines: int, running_cfg: TurnkeepConfig) -> None:
    """After a scale: the count, and the config's own count (the file's, when the running count already came from
    it)."""
    kept = _read(run_dir)
    config_engines = kept.config_engines if isinstance(kept, ScaledCount) else running_cfg.policy.engines
    atomic_write_json(run_dir / SCALED_FILE, ScaledCount(engines=engines, config_engines=config_engines).model_dump())


def count_at_start(cfg: TurnkeepConfig) -> StartCount:
    """The config with the scaled count in `policy.engines` when the run was scaled and its config still says what it
    said then."""
    run_dir = cfg.run.run_dir
    kept = _read(run_dir)
    if kept is None:
        return StartCount(cfg, None)
    path = run_dir / SCALED_FILE
    if isinstance(kept, str):
        path.unlink(missing_ok=True)
        return StartCount(cfg, f"{path} is unreadable ({kept}); starting {cfg.policy.engines} policy engines as "
                               "policy.engines says, and the file is removed")
    if kept.config_engines != cfg.policy.engines:
        path.unlink(missing_ok=True)
        return StartCount(cfg, f"policy.engines changed from {kept.config_engines} to {cfg.policy.engines} since the "
                               f"run was scaled to {kept.engines}: starting {cfg.policy.engines} as the config says")
    if kept.engines == cfg.policy.engines:
        return StartCount(cfg, None)
    policy = cfg.policy.model_copy(update={"engines": kept.engines})
    return StartCount(cfg.model_copy(update={"policy": policy}),
                      f"{kept.engines} policy engines, as `turnkeep scale` left the run (policy.engines says "
                      f"{kept.config_engines}; change it to start with another count)")


def _read(run_dir: Path) -> ScaledCount | str | None:
    """The kept count, None without one, or what is wrong with the file."""
    try:
        data = (run_dir / SCALED_FILE).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        return str(err)
    try:
        return ScaledCount.model_validate(orjson.loads(data))
    except (orjson.JSONDecodeError, ValidationError) as err:
        return str(err).splitlines()[0]
