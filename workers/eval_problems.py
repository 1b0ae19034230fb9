"""The held-out problems an evaluation plays: a prompts file, else the held-out seeds of the run's `tool_chat`
reasoning-gym tasks (`workers/prompts.py`), the first `limit` of them."""

from __future__ import annotations

from pathlib import Path

from turnkeep.config.loader import ConfigError
from turnkeep.controller.state.prompt_files import PromptFile
from turnkeep.schemas.choices import ADAPTER_KINDS
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.rollout import Problem, PromptRecord
from turnkeep.workers.env_datasets import environment_datasets
from turnkeep.workers.prompts import heldout_source, reasoning_gym_environments


def eval_problems(cfg: TurnkeepConfig, prompts: Path | None, limit: int | None) -> list[Problem]:
    """Raises ConfigError when there are none (no file given and no reasoning-gym tasks)."""
    source = PromptFile(prompts, env_names=cfg.environments.keys()) if prompts is not None else heldout_source(cfg)
    if source is None:
        raise ConfigError("no held-out problems: the config has no tool_chat environment with reasoning_gym tasks "
                          "and no environment with a held-out dataset; give --prompts FILE (or eval.prompts)")
    count = source.size if limit is None else min(limit, source.size)
    return [_problem(source.record(i), cfg) for i in range(count)]


def run_eval_problems(cfg: TurnkeepConfig) -> list[Problem]:
    """A run's held-out problems ([eval]); none when it has no source (evaluations are then refused in one line).
    A prompts file that cannot be read raises ConfigError (the run does not start)."""
    if cfg.eval.prompts is None and not reasoning_gym_environments(cfg) and (
            not adapted_environments(cfg) or environment_datasets(cfg, "heldout") is None):
        return []
    return eval_problems(cfg, cfg.eval.prompts, cfg.eval.prompts_limit)


def adapted_environments(cfg: TurnkeepConfig) -> list[str]:
    """Environments run through an ecosystem's adapter, whose datasets may hold held-out rows."""
    return [name for name, spec in cfg.environments.items() if spec.kind in ADAPTER_KINDS]


def _problem(record: PromptRecord, cfg: TurnkeepConfig) -> Problem:
    env = record.env
    if env is None:
        if len(cfg.environments) != 1:
            raise ConfigError(f"a prompt names no env and the config has {len(cfg.environments)} environments; "
                              "give each record an \"env\"")
        [env] = cfg.environments
    return Problem(question=record.prompt, answer=record.answer, env=env, metadata=record.metadata)
