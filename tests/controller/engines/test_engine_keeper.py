"""A dead engine leaves the routes at once, is replaced on its index, catches up, and is routed to again; no live
engine for long enough stops the run with one line."""

from __future__ import annotations

import asyncio
import json

import turnkeep.controller.engines.engine_keeper as keeper_module
from tests.controller.engines.fake_engines import FakeEngineActor, FakeTrainer
from turnkeep.controller.engines.engine_keeper import EngineKeeper
from turnkeep.controller.engines.engine_pool import Engine, EnginePool, EngineState


def test_a_dead_engine_is_replaced_and_routed_to_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(keeper_module, "PROBE_INTERVAL_S", 0.01)
    actors = [FakeEngineActor(0), FakeEngineActor(1)]
    pool = EnginePool([Engine(k, a, f"http://e{k}") for k, a in enumerate(actors)])
    routes: list[list[str]] = []
    started: list[int] = []

    async def changed() -> None:
        routes.append(pool.routable_urls())

    async def on_start(engine: Engine) -> None:
        started.append(engine.index)

    async def spawn(index: int, restarts: int) -> Engine:
        await asyncio.sleep(0.05)
        return Engine(index, FakeEngineActor(index), f"http://e{index}-r{restarts}", state=EngineState.STARTING)

    pool.on_change.append(changed)
    pool.on_start.append(on_start)

    async def scenario() -> EngineKeeper:
        keeper = EngineKeeper(pool, spawn, FakeTrainer(version=3), run_dir=tmp_path, no_engine_stop_s=60,
                              restart_pause_s=0)
        keeper.start()
        actors[1].kill()
        for _ in range(200):
            if keeper.restarts:
                break
            await asyncio.sleep(0.01)
        await keeper.stop()
        return keeper

    keeper = asyncio.run(scenario())
    assert keeper.restarts == 1 and started == [1]
    # Left the routes at once, came back at its new address once it served the trainer's version.
    assert routes == [["http://e0"], ["http://e0", "http://e1-r1"]]
    fresh = pool.get(1)
    assert fresh.state is EngineState.LIVE and fresh.version == 3 and fresh.actor.loaded == [("blob-3", 3)]
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["kind"] == "engine_restart" and line["engine"] == 1 and line["seconds"] >= 0.05


def test_no_live_engine_for_long_enough_stops_the_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(keeper_module, "PROBE_INTERVAL_S", 0.01)
    pool = EnginePool([Engine(0, FakeEngineActor(0), "http://e0", state=EngineState.DEAD)])
    keeper = EngineKeeper(pool, None, None, run_dir=tmp_path, no_engine_stop_s=0.1, restart_pause_s=0)
    reason = asyncio.run(asyncio.wait_for(keeper.none_live(), 5))
    assert reason.startswith("no policy engine has been live for 0.1s") and "run the same command again" in reason
