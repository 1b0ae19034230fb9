"""What `turnkeep export` reads from a run directory: one trainer checkpoint (the newest, or a step's), checked as a
restore checks it (every file against its manifest's digest, the run that wrote it, the settings it was written
with), the model folder the run trained from (its config, tokenizer and chat template go into the export) and the
dtype of its weights. Anything that cannot be exported is `ExportRefused`: one line that names the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic import ValidationError

from turnkeep.config.loader import ConfigError
from turnkeep.controller.fingerprint import config_fingerprint, fingerprint_fields
from turnkeep.controller.restore.run_identity import RUN_FILE
from turnkeep.controller.restore.verify import verify_trainer_checkpoint
from turnkeep.controller.stores.trainer_checkpoint import CHECKPOINT_MANIFEST, checkpoint_root, published_steps
from turnkeep.gpu_workers.tiny_model.model_files import check_model_files
from turnkeep.gpu_workers.tiny_model.transcripts import DemonstrationsError
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.model_maker import cached_tiny_model_dir
from turnkeep.workers.model_source import with_model_resolved

CONFIG_FILE = re.compile(r"^config(?:\.(\d+))?\.json$")
"""The run's settings: `config.json` from its first incarnation, `config.<n>.json` from each restart."""


class ExportRefused(Exception):
    """Nothing can be exported as asked; the message is one line naming the fix."""


@dataclass(frozen=True)
class ExportSource:
    checkpoint: Path
    """`<run_dir>/checkpoints/step_N`, verified."""
    step: int
    model_dir: Path
    """The model folder the run trained from."""
    dtype: str
    """`model.dtype` of the run: the weights are written in it."""


def export_source(run_dir: Path, step: int | None) -> ExportSource:
    run_id = _run_id(run_dir)
    step = _chosen_step(run_dir, step)
    checkpoint = checkpoint_root(run_dir) / f"step_{step}"
    cfg = _config_of(run_dir, checkpoint)
    _, skipped = verify_trainer_checkpoint(checkpoint, run_id, config_fingerprint(cfg), fingerprint_fields(cfg))
    if skipped is not None:
        raise ExportRefused(f"trainer checkpoint {checkpoint} cannot be exported ({skipped.problem}): "
                            f"{skipped.detail}. {other_steps(run_dir, step)}")
    return ExportSource(checkpoint, step, _model_dir(run_dir, cfg), cfg.model.dtype)


def other_steps(run_dir: Path, step: int) -> str:
    """The fix for a checkpoint that cannot be exported: the run's other checkpoints."""
    others = [str(s) for s in published_steps(run_dir) if s != step]
    if not others:
        return "The run has no other trainer checkpoint to export; continue the run to write a new one"
    return f"Export another with --step (the run's other checkpoints: steps {', '.join(others)})"


def _run_id(run_dir: Path) -> str:
    run_file = run_dir / RUN_FILE
    if not run_file.is_file():
        raise ExportRefused(f"{run_dir} is not a turnkeep run directory (it holds no {RUN_FILE}); pass the "
                            "run.run_dir (--run-dir) a `turnkeep run` wrote to")
    try:
        return str(orjson.loads(run_file.read_bytes())["run_id"])
    except (orjson.JSONDecodeError, KeyError, TypeError, OSError) as err:
        raise ExportRefused(f"{run_file} is damaged ({err}); it must hold the run's id "
                            '({"run_id": ..., "incarnation": ...}): restore it from a copy') from None


def _chosen_step(run_dir: Path, step: int | None) -> int:
    steps = published_steps(run_dir)
    if not steps:
        raise ExportRefused(f"{run_dir} holds no trainer checkpoint yet (checkpoints/step_N/); run it until it "
                            "writes one (every train.save_period steps, and at each snapshot), then export")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ExportRefused(f"{run_dir} has no trainer checkpoint of step {step} (it has steps "
                            f"{', '.join(map(str, steps))}); pass one of them to --step, or leave --step out for "
                            "the newest")
    return step


def _config_of(run_dir: Path, checkpoint: Path) -> TurnkeepConfig:
    """The run's settings the checkpoint was written with: the newest of the run's config files whose fingerprint
    is the checkpoint's (a restart may have changed settings a checkpoint does not depend on), else the newest."""
    configs = _run_configs(run_dir)
    written_with = _manifest_fingerprint(checkpoint)
    matching = [cfg for cfg in configs if config_fingerprint(cfg) == written_with]
    return (matching or configs)[-1]


def _run_configs(run_dir: Path) -> list[TurnkeepConfig]:
    """The run's config files, oldest first, as configs."""
    found = sorted((int(match.group(1) or 1), path) for path in run_dir.iterdir()
                   if (match := CONFIG_FILE.match(path.name)))
    if not found:
        raise ExportRefused(f"{run_dir} holds no config.json, so the model it trained is unknown; restore the "
                            "run directory's config.json from a copy")
    configs = []
    for _, path in found:
        try:
            configs.append(TurnkeepConfig.model_validate_json(path.read_bytes()))
        except (ValidationError, OSError) as err:
            first = str(err).splitlines()[0]
            raise ExportRefused(f"{path} cannot be read as this turnkeep's config ({first}); export with the "
                                "turnkeep version that ran it") from None
    return configs


def _manifest_fingerprint(checkpoint: Path) -> str | None:
    """The checkpoint's recorded fingerprint, read loosely: a damaged manifest is the verify step's to name."""
    try:
        return orjson.loads((checkpoint / CHECKPOINT_MANIFEST).read_bytes()).get("config_fingerprint")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return None


def _model_dir(run_dir: Path, cfg: TurnkeepConfig) -> Path:
    """The folder the run's trainer loaded its model from; never made or fetched anew but for a hub id, which is
    looked up in the Hugging Face cache as the run did."""
    try:
        if cfg.model.path is not None:
            return check_model_files(Path(with_model_resolved(cfg).model.path).expanduser())
        found = cached_tiny_model_dir(cfg)
    except (ConfigError, DemonstrationsError) as err:
        raise ExportRefused(f"the model run {run_dir} trained cannot be found: {err}") from None
    if found is None:
        raise ExportRefused(
            f"the tiny model run {run_dir} trained is not in model.cache_dir ({cfg.model.cache_dir}) on this machine; "
            f"make it with `turnkeep make-model` and the run's settings (they are in {run_dir / 'config.json'}), "
            "or export on the machine that ran it")
    return found
