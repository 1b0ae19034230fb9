"""Siblings whose row is stored but whose ledger entry is not sealed yet: the row decides.

The rollout pump stores a row under the data-plane barrier and seals its sibling only
after the row's ACK (the last sibling to seal settles the group), so a cut (a snapshot's
or a trainer checkpoint's) can fall between the two. A restore must never continue a
sibling whose row it holds, so it seals those first; a journal snapshot's count of running
agents leaves them out the same way.
"""

from __future__ import annotations

from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.group_ledger import GroupLedger


def stored_but_running(data_plane: DataPlane, ledger: GroupLedger) -> list[tuple[str, int]]:
    """(group id, sibling) of each running sibling that already has its row in the data plane."""
    return [(group_id, sibling) for group_id, sibling in ledger.running_siblings()
            if data_plane.has_row(group_id, sibling)]


def seal_stored_rows(data_plane: DataPlane, ledger: GroupLedger) -> list[tuple[str, int]]:
    """Seal every running sibling that has its row; returns them."""
    found = stored_but_running(data_plane, ledger)
    for group_id, sibling in found:
        ledger.seal(group_id, sibling)
    return found
