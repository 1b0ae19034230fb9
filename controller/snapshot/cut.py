"""`data_plane.cut`: the controller's state at one moment, under the data-plane barrier.

Under the barrier no row is stored, so one journal position marks the data plane, the
group ledger and the dataloader at once (the journal holds every change up to it; see
`controller.journal`), and the continuations are checked against them. No ACK is in flight
either: the servers are prepared, so each row's ACK was answered (checked here).
First the train pump's step is checked against what the attempt expects: with the
trainer hold it cannot have moved (if it did, that is a bug); without it a step that
finished during the Gym phase makes the attempt worthless, as in the peer system.

A journal snapshot (`snapshot.agents = "journal"`) parked nothing: its state names the
environment servers' turn journal positions instead of saved agents, and ACKs may be in
flight (their rows are journaled, so the cut holds them).

Nothing under the barrier waits on the network, ACKs included (they go out after it
opens, `pending_acks`): while it is held no row is stored anywhere in the controller, so
a call to a server that hangs would stall the cut, the trainer checkpoint and every
rollout with it. What needs a server (the
environment servers' counters of the progress marker) is asked before the barrier.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from turnkeep.controller.state.continuations import read_saved_agents
from turnkeep.controller.state.cut_state import capture_cut
from turnkeep.controller.stores import snapshot_store
from turnkeep.primitives.atomic_files import atomic_write_bytes
from turnkeep.primitives.snapshot_errors import AcksInFlight, InvariantBroken, TrainerMoved
from turnkeep.schemas.attempt_steps import TrainerHoldResult
from turnkeep.schemas.audit import CutTaken
from turnkeep.schemas.choices import AgentsFrom, CutKind
from turnkeep.schemas.participant import Artifact, JournalMark, SavedAgent

STATE_FILE = Path("controller") / "state.json"
AGENTS_FROM = "agents_from"
"""`journal` in a journal snapshot's state: a restore continues its running agents from the turn journals."""
TURN_JOURNALS = "turn_journals"
"""A journal snapshot's `JournalMark`s, one per environment server."""


@dataclass(frozen=True)
class Cut:
    artifact: Artifact
    data_plane_rows: int
    unfinished_groups: int
    continuations: int
    cut_unix_s: float
    policy_version: int
    """The policy version of the committed step, as the train pump recorded it."""
    barrier_s: float = 0.0
    """Seconds the data-plane barrier was held: no row was stored meanwhile."""
    running_agents: int = 0
    """Siblings running at a journal snapshot's cut: a restore continues them from the turn journals."""

    def counts(self) -> dict[str, int]:
        return {"data_plane_rows": self.data_plane_rows, "unfinished_groups": self.unfinished_groups,
                "continuations": self.continuations}


async def cut_data_plane(
    controller, staging: Path, anchor_step: int, hold: TrainerHoldResult | None,
    under_barrier: Callable[[], Awaitable[None]] | None = None, marks: list[JournalMark] | None = None,
    checkpoint_hold: bool = False,
) -> Cut:
    """Write `<staging>/controller/state.json`; `under_barrier` runs before the barrier opens again
    and must not wait on the network (ask servers before calling this).

    `hold` is what `trainer.hold` returned, None for an attempt without the trainer hold. `marks`: a journal
    snapshot's turn journal positions (its agents were neither parked nor saved); None reads the saved agents.
    `checkpoint_hold`: the attempt holds the trainer by the train pump's checkpoint hold, not one of its own.
    """
    saved_agents = read_saved_agents(staging) if marks is None else []
    return await cut_under_barrier(controller, staging, saved_agents, anchor_step, hold, under_barrier, marks,
                                   checkpoint_hold)


async def cut_under_barrier(
    controller, staging: Path, saved_agents: list[SavedAgent], anchor_step: int, hold: TrainerHoldResult | None,
    under_barrier: Callable[[], Awaitable[None]] | None = None, marks: list[JournalMark] | None = None,
    checkpoint_hold: bool = False,
) -> Cut:
    """Everything the cut does while no row is stored (and, the servers being prepared, no ACK in flight)."""
    async with controller.data_plane.barrier:
        entered = time.perf_counter()
        # A journal snapshot parks nothing, so ACKs may be in flight: each one's row is journaled already, and
        # the cut holds it (its sibling is sealed there, never continued).
        if marks is None and (in_flight := controller.data_plane.pending_acks.receipts()):
            # Prepared servers hold no unACKed result; one in flight now could be saved by its server as well.
            raise AcksInFlight(in_flight)
        training = controller.training
        if hold is None and training.step != anchor_step:
            raise TrainerMoved(anchor_step, training.step, checkpoint_hold)
        if hold is not None and (training.step, training.policy_version) != (hold.step, hold.policy_version):
            raise InvariantBroken(
                f"the trainer moved under the hold: the cut sees step {training.step} (policy version "
                f"{training.policy_version}), the hold returned step {hold.step} (policy version {hold.policy_version})"
            )
        capture = capture_cut(controller, saved_agents)
        # A sibling whose row is stored already is sealed by a restore (`controller.state.sealing`), not continued.
        running = (sum(not controller.data_plane.has_row(*key) for key in controller.ledger.running_siblings())
                   if marks is not None else 0)
        policy_version = training.policy_version
        if controller.audit is not None:
            controller.audit.emit(CutTaken, kind=CutKind.SNAPSHOT, **capture.summary)  # under the barrier: in row order
            controller.audit.flush()  # every row the cut saves is in the audit log first
        if under_barrier is not None:
            await under_barrier()
        barrier_s = time.perf_counter() - entered
    # The position is taken; its records reach the disk after the barrier opens, before the state names them.
    await controller.data_plane.journal.durable(capture.position.seq)
    path = staging / STATE_FILE
    path.parent.mkdir(exist_ok=True)
    state = capture.state
    if marks is not None:
        state[AGENTS_FROM] = AgentsFrom.JOURNAL
        state[TURN_JOURNALS] = [mark.model_dump() for mark in marks]
    atomic_write_bytes(path, orjson.dumps(state))
    return Cut(
        artifact=snapshot_store.artifact_for(staging, path), data_plane_rows=capture.summary["rows"],
        unfinished_groups=capture.summary["groups"], continuations=len(state["continuations"]),
        cut_unix_s=state["cut_unix_s"], policy_version=policy_version, barrier_s=barrier_s, running_agents=running,
    )
