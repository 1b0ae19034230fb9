"""Seeded source of prompt groups whose position is part of every checkpoint."""

from __future__ import annotations

import random

from envs.calc_task import sample_problem
from schemas.config import EnvironmentSpec, TaskConfig
from schemas.rollout import Problem


class PromptDataloader:
    """Problem i is a pure function of (seed, i), so restoring `next_index` resumes exactly.

    With several environments, group i goes to one of them by weight, also from (seed, i).
    """

    def __init__(self, task: TaskConfig, seed: int, environments: dict[str, EnvironmentSpec] | None = None) -> None:
        self._task = task
        self._seed = seed
        environments = environments or {"calc": EnvironmentSpec()}
        self._env_names = sorted(environments)
        self._env_weights = [environments[name].weight for name in self._env_names]
        self.next_index = 0

    def next_group(self) -> tuple[str, Problem]:
        index = self.next_index
        self.next_index += 1
        problem = sample_problem(self._task, random.Random(f"{self._seed}:{index}"))
        env = self._env_names[0]
        if len(self._env_names) > 1:
            env = random.Random(f"{self._seed}:{index}:env").choices(self._env_names, self._env_weights)[0]
        return f"g{index:07d}", problem.model_copy(update={"env": env})

    def state_dict(self) -> dict:
        return {"seed": self._seed, "next_index": self.next_index}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self._seed:
            raise ValueError(
                f"dataloader state was saved with seed {state['seed']}, this run uses {self._seed}; "
                "set run.seed back to the saved value"
            )
        self.next_index = int(state["next_index"])
