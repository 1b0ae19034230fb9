"""An operator's change of the engine count, carried out: new engines in parallel (each refitted before it takes
turns), removed ones retired (no new turns, their accepted calls finished, then stopped)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from turnkeep.controller.engines.engine_keeper import EngineKeeper
from turnkeep.controller.engines.engine_pool import EnginePool


@dataclass(frozen=True)
class Scaled:
    started: list[int]
    retired: list[int]


async def scale_to(keeper: EngineKeeper, pool: EnginePool, engines: list[int], drain_s: float) -> Scaled:
    current, wanted = set(pool.indices()), set(engines)
    started, retired = sorted(wanted - current), sorted(current - wanted)
    # Up first: a swap never leaves the run with fewer engines than either count.
    await asyncio.gather(*(keeper.add(index) for index in started))
    await asyncio.gather(*(keeper.retire(index, drain_s) for index in retired))
    return Scaled(started, retired)
