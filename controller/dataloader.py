"""Seeded source of prompt groups whose position is part of every checkpoint."""

from __future__ import annotations

import random

from envs.calc_task import sample_problem
from schemas.config import TaskConfig
from schemas.rollout import Problem


class PromptDataloader:
    """Problem i is a pure function of (seed, i), so restoring `next_index` resumes exactly."""

    def __init__(self, task: TaskConfig, seed: int) -> None:
        self._task = task
        self._seed = seed
        self.next_index = 0

    def next_group(self) -> tuple[str, Problem]:
        index = self.next_index
        self.next_index += 1
        rng = random.Random(f"{self._seed}:{index}")
        return f"g{index:07d}", sample_problem(self._task, rng)

    def state_dict(self) -> dict:
        return {"seed": self._seed, "next_index": self.next_index}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self._seed:
            raise ValueError(
                f"dataloader state was saved with seed {state['seed']}, this run uses {self._seed}; "
                "set run.seed back to the saved value"
            )
        self.next_index = int(state["next_index"])
