"""The run's prompt source: the prompts file `data.train` names, or else the default task's generated problems."""

from __future__ import annotations

from turnkeep.controller.state.prompt_files import PromptFile
from turnkeep.controller.state.prompt_sources import PromptSource
from turnkeep.envs.calc_task import CalcProblems
from turnkeep.schemas.config import TurnkeepConfig


def prompt_source(cfg: TurnkeepConfig) -> PromptSource:
    if cfg.data.train is not None:
        return PromptFile(cfg.data.train, env_names=cfg.environments.keys())
    return CalcProblems(cfg.task, cfg.run.seed)
