"""Checks of a run's config that need more than its schema, done before anything starts or is written."""

from __future__ import annotations

import tempfile
from pathlib import Path

from turnkeep.config.loader import ConfigError
from turnkeep.controller.rollout_levels import check_rollout_levels
from turnkeep.controller.state.prompt_files import check_prompt_file
from turnkeep.controller.stores.wandb_mirror import WandbUnavailable, check_wandb_installed
from turnkeep.envs.kinds import local_environments, resolve
from turnkeep.envs.loading import EnvironmentLoadError
from turnkeep.gpu_workers.tiny_model.model_files import check_model_files, unknown_layers, weight_names
from turnkeep.gpu_workers.tiny_model.transcripts import DemonstrationsError
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.config_train import LoraConfig
from turnkeep.workers.model_maker import transcript_source
from turnkeep.workers.ray_cluster.gpu_placement import check_local_gpus
from turnkeep.workers.ray_cluster.temp_dir import ray_temp_dir
from turnkeep.workers.temporal.ports import free_port


def check_before_start(cfg: TurnkeepConfig) -> None:
    """Raises ConfigError (one line per problem, naming the fix) for a config that cannot run."""
    check_writable_dir(cfg.run.run_dir, "run.run_dir (--run-dir)")
    check_writable_dir(cfg.model.cache_dir, "model.cache_dir")
    if not cfg.ray.address:
        ray_temp_dir(cfg.run.run_dir)  # Ray's sockets must fit the unix path limit somewhere
        check_local_gpus(cfg.placement, cfg.policy.engines, cfg.train.ranks)
        if cfg.model.path is not None:  # on a cluster, the node that loads it checks it
            check_model_files(Path(cfg.model.path).expanduser())
        if cfg.algorithm.reference_path is not None:
            check_model_files(Path(cfg.algorithm.reference_path).expanduser(), "algorithm.reference_path")
        if cfg.train.lora.rank and cfg.model.path is not None:
            check_lora_targets(Path(cfg.model.path).expanduser(), cfg.train.lora)
    if cfg.snapshot.enabled and cfg.temporal.address is None:
        free_port(cfg.temporal.ip)  # the embedded server's address, named before Ray starts and leaves a keeper
    check_rollout_levels(cfg)
    try:
        cfg.algorithm_settings()
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for name, spec in sorted(local_environments(cfg.environments).items()):
        try:
            resolve(name, spec)
        except EnvironmentLoadError as err:
            raise ConfigError(str(err)) from None
    check_prompt_file(cfg)
    if cfg.metrics.wandb:
        try:
            check_wandb_installed()
        except WandbUnavailable as err:
            raise ConfigError(str(err)) from None
    if cfg.model.path is None:
        try:
            transcript_source(cfg)
        except DemonstrationsError as err:
            raise ConfigError(str(err)) from None


def check_writable_dir(path: Path, setting: str) -> None:
    """A directory the run can make (or has) and write in. Probed in its nearest existing ancestor with a directory
    made and removed at once, so a run that cannot start leaves nothing behind."""
    path = Path(path).resolve()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        where = "is a file" if existing == path else f"is under {existing}, a file"
        raise ConfigError(f"{setting} = {path} {where}, not a directory; pick another directory")
    try:
        Path(tempfile.mkdtemp(prefix=".turnkeep-probe-", dir=existing)).rmdir()
    except OSError as err:
        raise ConfigError(f"{setting} = {path}: cannot write there ({err.strerror}); pick a directory you can write "
                          "to") from None


def check_lora_targets(model_dir: Path, lora: LoraConfig) -> None:
    """Every `train.lora.target_modules` names a layer of the model (read from its weight files' headers)."""
    names = weight_names(model_dir)
    missing = unknown_layers(names, list(lora.target_modules))
    if names and missing:
        layers = sorted({name.rsplit(".", 2)[-2] for name in names if name.count(".") >= 2})
        raise ConfigError(f"train.lora.target_modules {missing} name no layer of the model at {model_dir} (its "
                          f"layers: {', '.join(layers)}); name layers it has")
