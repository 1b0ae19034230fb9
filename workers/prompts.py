"""The run's prompt source: the prompts file `data.train` names, else the reasoning-gym tasks of its `tool_chat`
environments, else the environments' own datasets (an ecosystem's environment), else the default task's generated
problems."""

from __future__ import annotations

from turnkeep.controller.state.prompt_files import PromptFile
from turnkeep.controller.state.prompt_sources import PromptSource
from turnkeep.envs.calc_task import CalcProblems
from turnkeep.envs.reasoning_gym_tasks import ReasoningGymProblems, ReasoningGymTasks
from turnkeep.schemas.choices import EnvironmentKind
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.env_datasets import environment_datasets


def prompt_source(cfg: TurnkeepConfig) -> PromptSource:
    if cfg.data.train is not None:
        return PromptFile(cfg.data.train, env_names=cfg.environments.keys())
    tasks = reasoning_gym_environments(cfg)
    if tasks:
        return ReasoningGymProblems(tasks, cfg.run.seed)
    return environment_datasets(cfg, "train") or CalcProblems(cfg.task, cfg.run.seed)


def heldout_source(cfg: TurnkeepConfig) -> PromptSource | None:
    """The held-out problems of the run's reasoning-gym tasks, else of its environments' own datasets (None: the run
    has none)."""
    tasks = reasoning_gym_environments(cfg)
    if tasks:
        return ReasoningGymProblems(tasks, cfg.run.seed, split="heldout")
    return environment_datasets(cfg, "heldout")


def reasoning_gym_environments(cfg: TurnkeepConfig) -> dict[str, ReasoningGymTasks]:
    """`tool_chat` environments of this run with reasoning-gym tasks, by name."""
    found = {}
    for name, spec in cfg.environments.items():
        if spec.kind == EnvironmentKind.TOOL_CHAT and spec.options.get("reasoning_gym") is not None:
            found[name] = ReasoningGymTasks.model_validate(spec.options["reasoning_gym"])
    return found
