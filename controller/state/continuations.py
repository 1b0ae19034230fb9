"""Continuations: the parked agents a snapshot saves, checked against the cut.

Every saved agent must continue an unfinished group's sibling whose current attempt it
is, and that sibling must have no row in the data plane; anything else is a broken
invariant (a continuation that points at nothing, or one that would duplicate a row).
"""

from __future__ import annotations

from pathlib import Path

from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.group_ledger import GroupLedger, SiblingState
from turnkeep.primitives.snapshot_errors import InvariantBroken
from turnkeep.schemas.participant import SavedAgent

AGENTS_FILE = "agents.jsonl"


def read_saved_agents(staging: Path) -> list[SavedAgent]:
    agents = []
    for path in sorted(staging.glob(f"*/{AGENTS_FILE}")):
        for line in path.read_bytes().splitlines():
            if line.strip():
                agents.append(SavedAgent.model_validate_json(line))
    return agents


def check_continuations(agents: list[SavedAgent], ledger: GroupLedger, data_plane: DataPlane) -> list[dict]:
    """Validate every continuation against the cut; return them as the recovery ledger records them."""
    continuations = []
    for agent in agents:
        req = agent.request
        if req.rollout_id in ledger.abandoned(req.group_id):
            continue  # its group was rerun whole between the commit and the cut: it never continues
        sibling = ledger.sibling(req.group_id, req.sibling)
        if sibling is None:
            raise InvariantBroken(f"saved agent {req.rollout_id} continues group {req.group_id}, which is not in the cut")
        if sibling.state is not SiblingState.RUNNING or sibling.attempts != req.attempt + 1:
            raise InvariantBroken(
                f"saved agent {req.rollout_id} is attempt {req.attempt}, but the ledger has sibling "
                f"{req.group_id}.{req.sibling} {sibling.state} after {sibling.attempts} attempts"
            )
        if data_plane.has_row(req.group_id, req.sibling):
            raise InvariantBroken(f"saved agent {req.rollout_id} continues a sibling that already has a row")
        continuations.append(
            {"rollout_id": req.rollout_id, "group_id": req.group_id, "sibling": req.sibling,
             "attempt": req.attempt, "turn_index": agent.boundary.turn_index}
        )
    return continuations
