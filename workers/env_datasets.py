"""Prompts from the environments' own datasets: what an ecosystem's environment brings (a verifiers dataset, a NeMo
Gym server's rows, an OpenEnv environment's seeds), used when the run has no `data.train`.

Each environment whose class answers `dataset(options, split)` gives its records; they are interleaved one
environment after another so every environment gets its share, and read in epochs shuffled by `run.seed` like a
prompts file (a finite source). The records' digest is saved with every checkpoint, so a restore over another
dataset is refused, as for a prompts file.
"""

from __future__ import annotations

from itertools import zip_longest
from typing import Literal

from turnkeep.controller.state.prompt_files import records_digest
from turnkeep.envs.kinds import local_environments, resolve
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.rollout import PromptRecord


class EnvironmentDatasets:
    """The prompt source (`controller.state.prompt_sources`) of the environments' own datasets."""

    path = None

    def __init__(self, records: list[PromptRecord]) -> None:
        self._records = records
        self.digest = records_digest(records)

    @property
    def size(self) -> int:
        return len(self._records)

    def record(self, position: int) -> PromptRecord:
        return self._records[position]


def environment_datasets(cfg: TurnkeepConfig, split: Literal["train", "heldout"]) -> EnvironmentDatasets | None:
    """The run's environments' own records of `split`, interleaved (None: no environment has a dataset)."""
    by_env = []
    for name, spec in sorted(local_environments(cfg.environments).items()):
        loaded = resolve(name, spec)
        records = loaded.cls.dataset(loaded.options, split)
        if records:
            by_env.append([record.model_copy(update={"env": name}) for record in records])
    if not by_env:
        return None
    return EnvironmentDatasets([record for row in zip_longest(*by_env) for record in row if record is not None])
