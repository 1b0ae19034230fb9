"""The controller parts a cut reads, filled as a busy run would leave them: R finished rows
waiting in the data plane, and one unfinished group per parked agent in the ledger.

Everything is built through the real classes' own calls (`admit`, `start_attempt`,
`seal`, `settle`, `put`), so the ledger's entries are exactly what the pumps would
have left there.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from turnkeep.bench.synthetic_rollouts import POLICY_VERSION, chain_problem, finished_row
from turnkeep.controller.journal.state_journal import JournalSwitch, StateJournal
from turnkeep.controller.state.claim_ledger import ClaimLedger
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.dataloader import PromptDataloader
from turnkeep.controller.state.group_ledger import GroupLedger
from turnkeep.envs.calc_task import CalcProblems
from turnkeep.schemas.config import TaskConfig
from turnkeep.schemas.rollout import RolloutRequest

GROUP_SIZE = 8
STEP = 1
"""The trainer step the snapshot is filed under (`checkpoints/step_1`)."""


@dataclass
class SettledTraining:
    """The train pump as the cut reads it: between two steps, at STEP."""

    step: int = STEP
    policy_version: int = POLICY_VERSION


SYNC_EVERY_GROUPS = 1024
"""Fill writes its journal out this often, as a live run's ACKs do all along (records wait in memory until then)."""


class FilledController:
    audit = None
    """No audit log: the cut's flush is not what is timed."""

    def __init__(self) -> None:
        self.training = SettledTraining()
        self.journal = JournalSwitch()
        self.dataloader = PromptDataloader(CalcProblems(TaskConfig(), 0), seed=0, journal=self.journal)
        self.data_plane = DataPlane(self.journal)
        self.claims = ClaimLedger()
        self.ledger = GroupLedger(journal=self.journal)

    def start_journal(self, run_dir: Path) -> StateJournal:
        """Journal every change from now on, as `Controller.start_journal` does (a cut needs it)."""
        journal = StateJournal(run_dir, "bench", 1, self.state_dict())
        self.journal.switch_to(journal)
        return journal

    def fill(self, rows: int, turns: int, parked: list[RolloutRequest], rng: random.Random) -> None:
        """`rows` sealed rows in groups of GROUP_SIZE (the last one may be partial), plus the parked agents' groups.

        The rows share one random conversation per sibling (`model_copy` shares its segments): a cut reads no row,
        each row is still stored and journaled whole through the data plane's own `put`, and a million rows fit
        in memory (each with its own conversation took about 15 KB)."""
        templates = [finished_row(rng, "template", sibling, turns) for sibling in range(GROUP_SIZE)]
        for start in range(0, rows, GROUP_SIZE):
            group_id = f"d{start // GROUP_SIZE:07d}"
            self.ledger.admit(group_id, chain_problem(rng, turns), GROUP_SIZE)
            for sibling in range(min(GROUP_SIZE, rows - start)):
                self.ledger.start_attempt(group_id, sibling)
                self.data_plane.put(templates[sibling].model_copy(update={"group_id": group_id}))
                self.ledger.seal(group_id, sibling)
            self.ledger.settle(group_id)
            if self.journal.started and (start // GROUP_SIZE) % SYNC_EVERY_GROUPS == SYNC_EVERY_GROUPS - 1:
                self.journal.sync_blocking()
        # A parked agent's sibling is running its first attempt, so its continuation is valid.
        for request in parked:
            self.ledger.admit(request.group_id, request.problem, GROUP_SIZE)
            while self.ledger.sibling(request.group_id, request.sibling).attempts <= request.attempt:
                self.ledger.start_attempt(request.group_id, request.sibling)
        self.dataloader.advance_to(len(self.ledger.group_ids()))

    def state_dict(self) -> dict:
        """The same keys as `controller.runtime.Controller.state_dict`."""
        return {
            "step": STEP,
            "dataloader": self.dataloader.state_dict(),
            "data_plane": self.data_plane.state_dict(),
            "claim_ledger": self.claims.state_dict(),
            "group_ledger": self.ledger.state_dict(),
        }
