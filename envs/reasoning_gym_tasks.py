"""reasoning-gym's procedural tasks for `tool_chat`: problems drawn by seed, split into training and held-out seeds,
and each task's own verifier.

A task is a reasoning-gym dataset named by its name (`chain_sum`, `basic_arithmetic`, `countdown`, ...) with that
dataset's settings as its difficulty (`{"chain_sum": {"min_terms": 2, "max_terms": 3}}`). Problem `i` of a task is
entry `i` of the dataset built with a seed of the run: generated offline, the same on every machine and after every
restore. Training draws from one seed, the held-out set (`heldout_size` problems per task) from another, and a
training problem whose question is also a held-out one is skipped, so nothing the evaluation scores was trained on.

The entry travels with the problem (`problem.metadata["reasoning_gym"]`), so the environment server scores an answer
with the dataset's own `score_answer` without drawing the problem again. reasoning-gym is imported only where a task
is drawn or scored: `pip install 'turnkeep[tasks]'`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from turnkeep.schemas.rollout import PromptRecord

METADATA_KEY = "reasoning_gym"
TRAIN_SEED_SALT = 0
HELDOUT_SEED_SALT = 10 ** 12
"""reasoning-gym draws entry i of a dataset seeded s from `Random(s + i)`: seeds this far apart never meet."""
RUN_SEED_STRIDE = 10 ** 8
"""How far apart the datasets of two run seeds start."""
SKIP_STRIDE = 10 ** 7
"""Where a training problem that is also a held-out one is drawn again."""


class ReasoningGymTasks(BaseModel):
    """`[environments.<name>.options.reasoning_gym]`: the tasks a `tool_chat` environment trains and evaluates on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: list[str] = Field(min_length=1)
    """reasoning-gym dataset names, drawn in turn (e.g. ["chain_sum", "countdown"])."""
    config: dict[str, dict[str, Any]] = {}
    """Task name -> that dataset's settings (its difficulty), e.g. {chain_sum = {min_terms = 2, max_terms = 3}}."""
    heldout_size: int = Field(default=200, ge=0)
    """Held-out problems per task (their own seed; never trained on)."""


class TaskError(ValueError):
    """A task reasoning-gym does not have, settings it refuses, or reasoning-gym not installed; one line."""


def check_tasks(tasks: ReasoningGymTasks) -> None:
    """Each task exists and takes its settings (drawn once); TaskError names the first that does not."""
    unknown = sorted(set(tasks.config) - set(tasks.tasks))
    if unknown:
        raise TaskError(f"reasoning_gym.config names {unknown}, which are not in reasoning_gym.tasks {tasks.tasks}")
    for name in tasks.tasks:
        draw(tasks, name, "train", 0, 0)


def draw(tasks: ReasoningGymTasks, name: str, split: Literal["train", "heldout"], seed: int,
         index: int) -> dict[str, Any]:
    """Entry `index` of task `name` in `split` for the run's `seed`, JSON-ready: question, answer, metadata."""
    salt = (TRAIN_SEED_SALT if split == "train" else HELDOUT_SEED_SALT) + seed * RUN_SEED_STRIDE
    dataset = _dataset(name, json.dumps(tasks.config.get(name, {}), sort_keys=True), salt)
    return json.loads(json.dumps(dataset[index], default=str))


def score(entry: dict[str, Any], answer: str) -> float:
    """The task's own verifier on `answer` (0.0 .. 1.0)."""
    rg = _reasoning_gym()
    name = entry.get("metadata", {}).get("source_dataset")
    if not isinstance(name, str):
        raise TaskError("a reasoning_gym problem without metadata.source_dataset cannot be scored")
    return float(rg.get_score_answer_fn(name)(answer, entry))


class ReasoningGymProblems:
    """The prompt source (`controller.state.prompt_sources`) of `tool_chat` environments with reasoning-gym tasks:
    record i is a pure function of the seed and i, so a restored dataloader position resumes exactly."""

    path = None
    digest = None

    def __init__(self, environments: dict[str, ReasoningGymTasks], seed: int,
                 split: Literal["train", "heldout"] = "train") -> None:
        self._pairs = [(env, name) for env, tasks in sorted(environments.items()) for name in tasks.tasks]
        self._tasks = dict(environments)
        self._seed = seed
        self._split = split

        self._heldout = [(env, name, i) for env, name in self._pairs for i in range(self._tasks[env].heldout_size)]

    @property
    def size(self) -> int | None:
        """Endless for training; every held-out problem once for evaluation."""
        return None if self._split == "train" else len(self._heldout)

    def record(self, position: int) -> PromptRecord:
        if self._split == "heldout":
            env, name, index = self._heldout[position]
            entry = draw(self._tasks[env], name, "heldout", self._seed, index)
        else:
            env, name = self._pairs[position % len(self._pairs)]
            index = position // len(self._pairs)
            entry = draw(self._tasks[env], name, "train", self._seed, index)
            while entry["question"] in heldout_questions(self._tasks[env], name, self._seed):
                index += SKIP_STRIDE
                entry = draw(self._tasks[env], name, "train", self._seed, index)
        return PromptRecord(prompt=entry["question"], answer=entry["answer"], env=env,
                            metadata={METADATA_KEY: entry})


def heldout_questions(tasks: ReasoningGymTasks, name: str, seed: int) -> frozenset[str]:
    return _heldout_questions(tasks.model_dump_json(), name, seed)


@lru_cache(maxsize=32)
def _heldout_questions(tasks_json: str, name: str, seed: int) -> frozenset[str]:
    tasks = ReasoningGymTasks.model_validate_json(tasks_json)
    return frozenset(draw(tasks, name, "heldout", seed, i)["question"] for i in range(tasks.heldout_size))


@lru_cache(maxsize=64)
def _dataset(name: str, config_json: str, salt: int):
    rg = _reasoning_gym()
    try:
        return rg.create_dataset(name, seed=salt, size=HELDOUT_SEED_SALT, **json.loads(config_json))
    except (KeyError, ValueError, TypeError, AssertionError) as err:
        raise TaskError(f"reasoning_gym task {name!r} with settings {config_json}: {err}") from None


def _reasoning_gym():
    try:
        import reasoning_gym  # late: only where a task is drawn or scored (the `tasks` extra)
    except ModuleNotFoundError:
        raise TaskError("reasoning_gym tasks need reasoning-gym: pip install 'turnkeep[tasks]'") from None
    return reasoning_gym
