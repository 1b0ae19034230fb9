"""The held-out problems an evaluation plays: a prompts file, else the held-out seeds of the run's `tool_chat`
reasoning-gym tasks, else its environments' own held-out datasets (`workers/prompts.py`), the first `limit` of them."""

from __future__ import annotations

from pathlib import Path

from turnkeep.config.loader import ConfigError
from turnkeep.controller.state.prompt_files import PromptFile
from turnkeep.controller.state.prompt_sources import PromptSource
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.rollout import Problem, PromptRecord
from turnkeep.workers.prompts import heldout_source


def eval_problems(cfg: TurnkeepConfig, prompts: Path | None, limit: int | None) -> list[Problem]:
    """Raises ConfigError when there are none (no file given, no reasoning-gym tasks, no held-out dataset)."""
    source = PromptFile(prompts, env_names=cfg.environments.keys()) if prompts is not None else heldout_source(cfg)
    if source is None:
        raise ConfigError("no held-out problems: the config has no tool_chat environment with reasoning_gym tasks "
                          "and no environment with a held-out dataset; give --prompts FILE (or eval.prompts)")
    return _problems(source, cfg, limit)


def run_eval_problems(cfg: TurnkeepConfig) -> list[Problem]:
    """A run's held-out problems ([eval]); none when it has no source (evaluations are then refused in one line).
    A prompts file that cannot be read raises ConfigError (the run does not start)."""
    if cfg.eval.prompts is not None:
        return eval_problems(cfg, cfg.eval.prompts, cfg.eval.prompts_limit)
    source = heldout_source(cfg)  # built once: an adapter's held-out dataset may load a whole taskset
    return [] if source is None else _problems(source, cfg, cfg.eval.prompts_limit)


def _problems(source: PromptSource, cfg: TurnkeepConfig, limit: int | None) -> list[Problem]:
    count = source.size if limit is None else min(limit, source.size)
    return [_problem(source.record(i), cfg) for i in range(count)]


def _problem(record: PromptRecord, cfg: TurnkeepConfig) -> Problem:
    env = record.env
    if env is None:
        if len(cfg.environments) != 1:
            raise ConfigError(f"a prompt names no env and the config has {len(cfg.environments)} environments; "
                              "give each record an \"env\"")
        [env] = cfg.environments
    return Problem(question=record.prompt, answer=record.answer, env=env, metadata=record.metadata)
