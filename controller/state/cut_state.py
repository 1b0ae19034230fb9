"""What a cut records: a journal position, counts, digests and the checked continuations.

Called under the data-plane barrier (by `data_plane.cut` and by the trainer checkpoint,
and by `turnkeep bench scaling` to time exactly this code). Nothing here touches a row:
the journal already holds every change up to the position, and the data plane keeps its
row count and digest current, so the barrier's time does not grow with the rows. The
continuations are checked against the ledger one saved agent at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from turnkeep.controller.state.continuations import check_continuations
from turnkeep.primitives.gc_pause import collector_paused
from turnkeep.primitives.segment_format import LogPosition
from turnkeep.primitives.snapshot_errors import InvariantBroken
from turnkeep.schemas.audit import ids_digest
from turnkeep.schemas.participant import SavedAgent


@dataclass(frozen=True)
class CutCapture:
    state: dict
    """What `controller/state.json` (or a checkpoint's journal reference) holds: `journal_ref`, step, cut time,
    continuations."""
    summary: dict
    """What the audit log's `cut_taken` records: counts and digests."""
    position: LogPosition
    """The journal must be durable up to here before the state is written."""


def capture_cut(controller, saved_agents: list[SavedAgent]) -> CutCapture:
    """Capture the state at this moment; the caller holds the barrier."""
    journal = controller.data_plane.journal
    if not journal.started:
        raise InvariantBroken("a cut was taken before the controller started its journal (Controller.start_journal "
                              "runs at every start, fresh or restored)")
    with collector_paused():
        continuations = check_continuations(saved_agents, controller.ledger, controller.data_plane)
    data_plane, ledger = controller.data_plane, controller.ledger
    position = journal.position()
    ref = journal.ref(position, data_plane.num_rows(), data_plane.rows_digest(), ledger.inflight(),
                      ledger.groups_digest())
    cut_unix_s = time.time()
    step = controller.training.step
    state = {"journal_ref": ref.model_dump(), "step": step, "cut_unix_s": cut_unix_s, "continuations": continuations}
    summary = {
        "step": step, "cut_unix_s": cut_unix_s, "next_group_index": controller.dataloader.next_index,
        "rows": ref.rows, "rows_digest": ref.rows_digest, "groups": ref.groups, "groups_digest": ref.groups_digest,
        "continuations": len(continuations), "continuations_digest": ids_digest(c["rollout_id"] for c in continuations),
    }
    return CutCapture(state=state, summary=summary, position=position)
