"""Seeded source of prompt groups whose position is part of every checkpoint."""

from __future__ import annotations

import random

from turnkeep.controller.journal.records import CURSOR
from turnkeep.controller.journal.state_journal import NO_JOURNAL, JournalHooks
from turnkeep.controller.state.prompt_sources import PromptSource
from turnkeep.schemas.config import EnvironmentSpec
from turnkeep.schemas.rollout import Problem, PromptRecord


class PromptDataloader:
    """Group i is a pure function of (source, seed, i), so restoring `next_index` resumes exactly.

    From an endless source (generated problems) group i is record i. From one of n records,
    group i is record `order[i % n]` of epoch `i // n`, where each epoch's order is a
    permutation seeded by (seed, epoch) when `shuffle` (the source's order otherwise). A group
    goes to its record's `env`, or else to one of the environments by weight, also from (seed, i).
    """

    def __init__(self, source: PromptSource, seed: int, environments: dict[str, EnvironmentSpec] | None = None, *,
                 shuffle: bool = True, journal: JournalHooks = NO_JOURNAL) -> None:
        self._source = source
        self._seed = seed
        environments = environments or {"calc": EnvironmentSpec()}
        self._env_names = sorted(environments)
        self._env_weights = [environments[name].weight for name in self._env_names]
        self._shuffle = shuffle
        self._order: list[int] = []
        self._order_epoch: int | None = None
        self.next_index = 0
        self.journal = journal

    @property
    def epoch(self) -> int:
        """Whole passes over the prompts file so far (the epoch the next group comes from); 0 for generated problems."""
        size = self._source.size
        return 0 if size is None else self.next_index // size

    def next_group(self) -> tuple[str, Problem]:
        index = self.next_index
        self.next_index += 1
        self.journal.record(CURSOR, self.state_dict())
        record = self._record_at(index)
        problem = Problem(question=record.prompt, answer=record.answer, env=record.env or self._weighted_env(index),
                          metadata=record.metadata)
        return f"g{index:07d}", problem

    def advance_to(self, index: int) -> None:
        """Move the position without drawing (a benchmark that admitted its groups by other means)."""
        self.next_index = index
        self.journal.record(CURSOR, self.state_dict())

    def state_dict(self) -> dict:
        return {"seed": self._seed, "next_index": self.next_index, "epoch": self.epoch,
                "prompts_file": None if self._source.path is None else str(self._source.path),
                "prompts_digest": self._source.digest}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self._seed:
            raise ValueError(
                f"dataloader state was saved with seed {state['seed']}, this run uses {self._seed}; "
                "set run.seed back to the saved value"
            )
        # States from before prompts files have only seed and next_index: generated problems.
        self._check_same_prompts(state.get("prompts_file"), state.get("prompts_digest"))
        self.next_index = int(state["next_index"])

    def _check_same_prompts(self, saved_file: str | None, saved_digest: str | None) -> None:
        """The position means nothing over other prompts: refuse rather than silently train on a different order."""
        digest, path = self._source.digest, self._source.path
        if saved_digest == digest:
            return
        if saved_digest is None:
            raise ValueError(f"dataloader state was saved with generated problems ([task]), this run reads prompts "
                             f"from {path}; unset data.train to continue that run, or use a new run_dir")
        if digest is None:
            raise ValueError(f"dataloader state was saved reading prompts from {saved_file}, this run uses generated "
                             f"problems; set data.train = \"{saved_file}\" to continue that run, or use a new run_dir")
        raise ValueError(f"dataloader state was saved reading prompts from {saved_file} (records sha256 "
                         f"{saved_digest[:12]}), this run reads {path} whose records differ (sha256 "
                         f"{digest[:12]}); point data.train at the original file to continue, "
                         "or use a new run_dir")

    def _record_at(self, index: int) -> PromptRecord:
        size = self._source.size
        if size is None:
            return self._source.record(index)
        epoch, position = divmod(index, size)
        if self._shuffle:
            position = self._epoch_order(epoch, size)[position]
        return self._source.record(position)

    def _epoch_order(self, epoch: int, size: int) -> list[int]:
        # Groups are drawn in order, so caching the current epoch's permutation makes a draw O(1).
        if self._order_epoch != epoch:
            order = list(range(size))
            random.Random(f"{self._seed}:epoch:{epoch}").shuffle(order)
            self._order, self._order_epoch = order, epoch
        return self._order

    def _weighted_env(self, index: int) -> str:
        if len(self._env_names) == 1:
            return self._env_names[0]
        return random.Random(f"{self._seed}:{index}:env").choices(self._env_names, self._env_weights)[0]
