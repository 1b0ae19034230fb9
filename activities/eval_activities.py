"""`eval.request`: the run workflow's `evaluate_now` signal, carried out by the controller that runs evaluations."""

from __future__ import annotations

import logging

from temporalio import activity

from turnkeep.activities.errors import check_incarnation
from turnkeep.controller.snapshot.coordinator import SnapshotCoordinator
from turnkeep.schemas.eval_steps import EVAL_REQUEST, EvalRequestInput, EvalRequestResult

log = logging.getLogger("turnkeep.eval")


class EvalActivities:
    def __init__(self, snapshots: SnapshotCoordinator) -> None:
        self._snapshots = snapshots

    @activity.defn(name=EVAL_REQUEST)
    async def request(self, inp: EvalRequestInput) -> EvalRequestResult:
        check_incarnation(inp.incarnation, self._snapshots.incarnation)
        controller = self._snapshots.controller
        step = controller.training.step
        note = controller.evaluations.request(step, inp.reason)
        log.info("evaluation asked for (%s) at step %d: %s", inp.reason, step, note)
        return EvalRequestResult(step=step, note=note)
