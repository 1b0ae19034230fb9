"""The controller's journaled state without its processes: the real data plane, group ledger and dataloader,
driven by random changes of every kind, with cuts taken the way the controller takes them."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import orjson

from turnkeep.controller.journal.records import STEP, TRAINED
from turnkeep.controller.journal.state_journal import StateJournal
from turnkeep.controller.state.claim_ledger import ClaimLedger
from turnkeep.controller.state.cut_state import capture_cut
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.dataloader import PromptDataloader
from turnkeep.controller.state.group_ledger import GroupLedger, SiblingState
from turnkeep.envs.calc_task import CalcProblems
from turnkeep.schemas.config import TaskConfig
from turnkeep.schemas.rollout import RolloutRow, Segment

GROUP_SIZE = 4


def make_row(group_id: str, sibling: int, attempt: int, rng: random.Random) -> RolloutRow:
    turns = rng.randint(1, 3)
    segments = [Segment(kind="prompt", token_ids=[rng.randrange(50) for _ in range(rng.randint(2, 30))])]
    for _ in range(turns):
        n = rng.randint(1, 40)
        segments.append(Segment(kind="policy", token_ids=[rng.randrange(50) for _ in range(n)],
                                logprobs=[-rng.random() for _ in range(n)], policy_version=rng.randrange(5)))
    return RolloutRow(group_id=group_id, sibling=sibling, attempt=attempt, segments=segments,
                      reward=float(rng.random() < 0.5), num_turns=turns)


class JournaledState:
    """What `Controller` holds and journals, with its `state_dict`."""

    def __init__(self) -> None:
        self.data_plane = DataPlane()
        self.ledger = GroupLedger()
        self.dataloader = PromptDataloader(CalcProblems(TaskConfig(), 3), seed=3)
        self.claims = ClaimLedger()
        self.training = SimpleNamespace(step=0)
        self.journal: StateJournal | None = None
        self.trained: list[tuple[int, str, dict, list[dict]]] = []
        """Each train step as it happened: (step, group id, its ledger entry and its rows just before)."""

    def state_dict(self) -> dict:
        return {"step": self.training.step, "dataloader": self.dataloader.state_dict(),
                "data_plane": self.data_plane.state_dict(), "claim_ledger": {"claims": {}},
                "group_ledger": self.ledger.state_dict()}

    def comparable(self) -> dict:
        """The state as JSON gives it back (enums as strings, tuples as lists)."""
        return orjson.loads(orjson.dumps(self.state_dict()))

    def start(self, run_dir: Path, incarnation: int, segment_bytes: int = 64 << 20) -> StateJournal:
        self.journal = StateJournal(run_dir, "run-test", incarnation, self.state_dict(), segment_bytes=segment_bytes)
        self.data_plane.journal = self.ledger.journal = self.dataloader.journal = self.journal
        return self.journal

    def cut(self) -> tuple[dict, dict]:
        """(what a snapshot's state.json holds, the live state it must replay to)."""
        capture = capture_cut(self, [])
        return capture.state, self.comparable()

    def random_change(self, rng: random.Random) -> None:
        """One change of any kind the pumps make, chosen at random among those possible now."""
        groups = self.ledger.group_ids()
        if len(groups) < 6 and rng.random() < 0.3:
            group_id, problem = self.dataloader.next_group()
            self.ledger.admit(group_id, problem, GROUP_SIZE)
            return
        if not groups:
            return
        group_id = rng.choice(groups)
        sibling = rng.randrange(GROUP_SIZE)
        entry = self.ledger.sibling(group_id, sibling)
        roll = rng.random()
        if entry.state is SiblingState.PENDING:
            self.ledger.start_attempt(group_id, sibling)
        elif entry.state is SiblingState.RUNNING and roll < 0.75:
            if self.data_plane.put(make_row(group_id, sibling, entry.attempts - 1, rng)):
                self.ledger.seal(group_id, sibling)
                self.ledger.settle(group_id)
        elif entry.state is SiblingState.RUNNING:
            self.ledger.fail(group_id, sibling, "timeout", max_attempts=3)
            self.ledger.settle(group_id)
        elif roll < 0.05:
            self.ledger.restart_group(group_id)
            self.data_plane.delete([group_id])
        elif roll < 0.1 and self.data_plane.sealed_count(group_id):
            self.data_plane.set_rewards(group_id, [rng.random() for _ in range(self.data_plane.sealed_count(group_id))])
        elif self.ledger.settle(group_id) is not None:
            self.train([group_id])

    def train(self, group_ids: list[str]) -> None:
        """What the train pump journals for one step, in its order."""
        before = self.comparable()
        entries = {g["group_id"]: g for g in before["group_ledger"]["groups"]}
        step = self.training.step + 1
        for group_id in group_ids:
            rows = [row for row in before["data_plane"]["rows"] if row["group_id"] == group_id]
            self.trained.append((step, group_id, entries[group_id], rows))
        self.journal.record(TRAINED, {"step": step, "policy_version": step, "groups": group_ids})
        self.data_plane.delete(group_ids)
        self.ledger.finish(group_ids)
        self.training.step = step
        self.journal.record(STEP, step)
