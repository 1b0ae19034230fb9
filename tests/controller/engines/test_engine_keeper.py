"""A dead engine leaves the routes at once, is replaced on its index, catches up, and is routed to again; no live
engine for long enough stops the run with one line; an engine scaled away while a refit loads into it is stopped
only after that load."""

from __future__ import annotations

import asyncio
import json

import pytest

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
        return await _stopped_after_a_restart(keeper, 2.0)

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


def test_an_engine_retired_during_a_refit_is_stopped_after_its_load_and_the_refit_succeeds(tmp_path,
                                                                                             monkeypatch) -> None:
    """A CI run: `turnkeep scale --engines 1` stopped engine 1 while a train step's refit was loading into it; the
    load found no vLLM and the run stopped. The moment is pinned: the retire starts once the slow load has begun."""
    monkeypatch.setattr(keeper_module.ray, "kill", lambda actor, no_restart=True: None)
    actors = [FakeEngineActor(0), FakeEngineActor(1)]
    actors[1].load_delay_s = 0.2
    pool = EnginePool([Engine(k, a, f"http://e{k}") for k, a in enumerate(actors)])

    async def scenario() -> list[dict]:
        keeper = EngineKeeper(pool, None, FakeTrainer(version=3), run_dir=tmp_path, no_engine_stop_s=60,
                              restart_pause_s=0)
        refit = asyncio.create_task(pool.load_weights("blob-4", 4))
        await asyncio.sleep(0.05)  # both loads are under way, engine 1's for another 0.15 s
        await keeper.retire(1, drain_s=0.0)
        loaded = await refit
        later = await pool.load_weights("blob-5", 5)
        return [loaded, later]

    loaded, later = asyncio.run(scenario())
    assert actors[1].events == ["loaded 4", "stopped"]
    assert [r["engine"] for r in loaded] == [0, 1] and [r["engine"] for r in later] == [0]
    assert pool.get(1) is None and actors[0].events == ["loaded 4", "loaded 5"]


@pytest.mark.parametrize(("hang", "probe"), [("core", "engine core token"), ("process", "actor call")])
def test_a_hung_engine_is_killed_by_its_probe_and_replaced(hang, probe, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(keeper_module, "PROBE_INTERVAL_S", 0.01)
    monkeypatch.setattr(keeper_module, "HANG_GRACE_S", 0.5)
    monkeypatch.setattr(keeper_module.ray, "kill", lambda actor, no_restart: actor.kill())
    actors = [FakeEngineActor(0), FakeEngineActor(1)]
    hang_s = 1.0  # wide against a loaded machine's delays: an answering engine must never look hung
    pool = EnginePool([Engine(k, a, f"http://e{k}") for k, a in enumerate(actors)])

    async def spawn(index: int, restarts: int) -> Engine:
        return Engine(index, FakeEngineActor(index), f"http://e{index}-r{restarts}", state=EngineState.STARTING)

    async def scenario() -> EngineKeeper:
        keeper = EngineKeeper(pool, spawn, FakeTrainer(version=2), run_dir=tmp_path, no_engine_stop_s=60,
                              restart_pause_s=0, hang_s=hang_s)
        keeper.start()
        await asyncio.sleep(0.6)
        assert keeper.restarts == 0  # answering engines are left alone
        if hang == "core":
            actors[1].probe_s = hang_s  # its engine core took the whole hang_s: no token came
        else:
            actors[1].frozen = True
        return await _stopped_after_a_restart(keeper, 10.0)

    keeper = asyncio.run(scenario())
    assert keeper.restarts == 1 and pool.get(1).url == "http://e1-r1" and pool.get(0).actor is actors[0]
    # The hung engine's own processes were killed by its actor where the actor still answered; then the actor.
    assert actors[1].dead and ("engine processes killed" in actors[1].events) == (hang == "core")
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    [hung] = [line for line in lines if line["kind"] == "hang"]
    assert (hung["target"], hung["probe"], hung["hang_s"]) == ("engine 1", probe, hang_s)


async def _stopped_after_a_restart(keeper: EngineKeeper, within_s: float) -> EngineKeeper:
    """The keeper once it replaced an engine (or `within_s` passed), stopped."""
    for _ in range(int(within_s / 0.01)):
        if keeper.restarts:
            break
        await asyncio.sleep(0.01)
    await keeper.stop()
    return keeper
