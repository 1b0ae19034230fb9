"""Checks of a run's config that need more than its schema, done before anything starts or is written."""

from __future__ import annotations

from controller.config_file import ConfigError
from controller.rollout_levels import check_rollout_levels
from controller.state.prompt_files import check_prompt_file
from envs.kinds import local_environments, resolve
from envs.loading import EnvironmentLoadError
from gpu_workers.tiny_model.transcripts import DemonstrationsError, demonstration_source
from schemas.config import TurnkeepConfig


def check_before_start(cfg: TurnkeepConfig) -> None:
    """Raises ConfigError (one line per problem, naming the fix) for a config that cannot run."""
    check_rollout_levels(cfg)
    for name, spec in sorted(local_environments(cfg.environments).items()):
        try:
            resolve(name, spec)
        except EnvironmentLoadError as err:
            raise ConfigError(str(err)) from None
    check_prompt_file(cfg)
    if cfg.model.path is None:
        try:
            demonstration_source(cfg)
        except DemonstrationsError as err:
            raise ConfigError(str(err)) from None
