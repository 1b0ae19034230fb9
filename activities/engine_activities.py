"""`engines.scale`: the run workflow's `set_engines` update, carried out by the controller that owns the engines.

The update's validator has refused a bad list before this runs, and the workflow runs it only between attempts,
so no parked attempt fences a set of engines that is changing under it.
"""

from __future__ import annotations

import time

from temporalio import activity

from turnkeep.activities.errors import check_incarnation, expected_failure
from turnkeep.activities.heartbeat import heartbeating
from turnkeep.controller.engines.engine_keeper import EngineKeeper
from turnkeep.controller.engines.engine_scaling import scale_to
from turnkeep.controller.engines.scaled_count import save_scaled
from turnkeep.controller.snapshot.coordinator import SnapshotCoordinator
from turnkeep.schemas.engine_steps import ENGINES_SCALE, ScaleEnginesInput, ScaleEnginesResult
from turnkeep.schemas.names import ErrorType

DRAIN_S = 30.0
"""A retiring engine's accepted calls get this long to finish before it stops anyway (their turns fail over)."""


class EngineActivities:
    def __init__(self, snapshots: SnapshotCoordinator, keeper: EngineKeeper | None = None) -> None:
        """`keeper`: the run's engine keeper, which starts and retires engines (None: this controller keeps none,
        and scaling is refused)."""
        self._snapshots = snapshots
        self._keeper = keeper

    @activity.defn(name=ENGINES_SCALE)
    async def scale(self, inp: ScaleEnginesInput) -> ScaleEnginesResult:
        snapshots = self._snapshots
        check_incarnation(inp.incarnation, snapshots.incarnation)
        controller = snapshots.controller
        keeper = self._keeper
        if keeper is None or not keeper.started:
            raise expected_failure("this controller does not keep its engines (it is starting or stopping); ask "
                                   "again in a moment", ErrorType.PARTICIPANT_REFUSED)
        began = time.monotonic()
        with heartbeating(f"scaling the policy engines to {inp.engines}"):
            scaled = await scale_to(keeper, controller.processes.engines, inp.engines, DRAIN_S)
        save_scaled(snapshots.run_dir, len(inp.engines), controller.cfg)  # the next start of the run keeps it
        return ScaleEnginesResult(engines=controller.processes.engines.indices(), started=scaled.started,
                                  retired=scaled.retired, seconds=round(time.monotonic() - began, 3))
