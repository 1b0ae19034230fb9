"""What the cut writes: the controller's state plus the checked continuations, captured at once.

Called under the data-plane barrier (by `data_plane.cut`, and by `turnkeep bench scaling`
to time exactly this code), with the garbage collector paused: it allocates a few
containers per row, and a full collection in the middle would stall the barrier.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from controller.state.continuations import check_continuations
from primitives.atomic_files import atomic_write_bytes
from primitives.gc_pause import collector_paused
from schemas.audit import ids_digest, row_key
from schemas.participant import SavedAgent


def write_cut_state(controller, saved_agents: list[SavedAgent], path: Path) -> dict:
    """Capture and durably write the state; returns it (the caller holds the barrier)."""
    with collector_paused():
        state = controller.state_dict()
        state["continuations"] = check_continuations(saved_agents, controller.ledger, controller.data_plane)
        state["cut_unix_s"] = time.time()
        path.parent.mkdir(exist_ok=True)
        atomic_write_bytes(path, orjson.dumps(state))
    return state


def cut_summary(state: dict) -> dict:
    """What the audit log's `cut_taken` records of a captured state: counts and digests, never the rows."""
    rows, groups = state["data_plane"]["rows"], state["group_ledger"]["groups"]
    continuations = state.get("continuations", [])
    return {
        "step": state["step"], "cut_unix_s": state["cut_unix_s"], "next_group_index": state["dataloader"]["next_index"],
        "rows": len(rows), "rows_digest": ids_digest(row_key(r["group_id"], r["sibling"]) for r in rows),
        "groups": len(groups), "groups_digest": ids_digest(g["group_id"] for g in groups),
        "continuations": len(continuations), "continuations_digest": ids_digest(c["rollout_id"] for c in continuations),
    }
