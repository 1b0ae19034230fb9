"""Whole-group reruns without the stack: a group that used its last round is dropped, and the audit
log says so before its rows go (the invariant checker counts the rows a cut must hold from it)."""

from __future__ import annotations

import asyncio
import random

from turnkeep.bench.filled_controller import finished_row
from turnkeep.controller.pumps.group_reruns import GroupReruns
from turnkeep.controller.rollout_levels import RolloutLevelPlan
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.group_ledger import GroupLedger
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.primitives.audit_log import AUDIT_FILE, AuditLog, read_audit
from turnkeep.schemas.audit import GroupDropped
from turnkeep.schemas.rollout import Problem

GROUP = "g0000000"


async def _cancel(rollout_id: str) -> None:
    pass


def test_a_group_out_of_rounds_is_dropped_with_an_event_and_its_rows_deleted(tmp_path):
    ledger, data_plane = GroupLedger(), DataPlane()
    ledger.admit(GROUP, Problem(question="Q 1+1", env="judge"), 2)
    ledger.start_attempt(GROUP, 0)
    data_plane.put(finished_row(random.Random(0), GROUP, 0, 2))
    ledger.seal(GROUP, 0)
    ledger.start_attempt(GROUP, 1)
    audit = AuditLog(tmp_path / AUDIT_FILE, 2)
    plans = {"judge": RolloutLevelPlan("judge", "judge", "exported", "turn", group_scored=True)}
    reruns = GroupReruns(plans, ledger, data_plane, None, RunStats(), 1, _cancel, audit)

    assert asyncio.run(reruns.rerun_after_failure(GROUP, "sibling 1 failed", 0)) is False
    audit.flush()
    [event] = list(read_audit(tmp_path))
    assert isinstance(event, GroupDropped) and (event.group_id, event.reason, event.inc) == (
        GROUP, "sibling 1 failed", 2)
    assert data_plane.rows(GROUP) == [] and ledger.settle(GROUP) is False
