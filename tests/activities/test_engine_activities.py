"""`engines.scale` goes to the engine keeper it was built with, and is refused while that keeper does not keep
the engines yet (the run is still starting) or when there is none."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from temporalio.exceptions import ApplicationError

from turnkeep.activities.engine_activities import EngineActivities
from turnkeep.controller.engines.engine_keeper import EngineKeeper
from turnkeep.controller.engines.engine_pool import EnginePool
from turnkeep.schemas.engine_steps import ScaleEnginesInput


def _refusal(keeper: EngineKeeper | None) -> str:
    snapshots = SimpleNamespace(incarnation=1, controller=SimpleNamespace())
    activities = EngineActivities(snapshots, keeper)
    with pytest.raises(ApplicationError) as refused:
        asyncio.run(activities.scale(ScaleEnginesInput(run_id="r", incarnation=1, engines=[0, 1])))
    return str(refused.value)


def test_scaling_is_refused_without_a_keeper_or_before_it_keeps_the_engines(tmp_path) -> None:
    async def spawn(index: int, restarts: int):
        raise AssertionError("nothing is started while the run starts")

    keeper = EngineKeeper(EnginePool([]), spawn, trainer=None, run_dir=tmp_path, no_engine_stop_s=60,
                          restart_pause_s=0)
    assert not keeper.started
    assert "does not keep its engines" in _refusal(None)
    assert "does not keep its engines" in _refusal(keeper)
