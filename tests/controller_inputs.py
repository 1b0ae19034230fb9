"""What a test hands a Controller that `turnkeep run` hands it from the worker's side: the run's prompt source, and
each environment's recovery level planned from the built-in classes' own capabilities (a run asks its servers)."""

from __future__ import annotations

from turnkeep.controller.rollout_levels import plan_levels
from turnkeep.envs.kinds import environment_capabilities
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.prompts import prompt_source


def level_plans(cfg: TurnkeepConfig) -> dict:
    plans, _ = plan_levels(cfg, environment_capabilities(cfg.environments, cfg.rollout.group_size))
    return plans


def controller_inputs(cfg: TurnkeepConfig) -> dict:
    return {"prompts": prompt_source(cfg), "level_plans": level_plans(cfg)}
