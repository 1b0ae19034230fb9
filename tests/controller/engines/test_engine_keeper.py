"""A dead engine leaves the routes at once, is replaced on its index, catches up, and is routed to again; no live
engine for long enough stops the run with one line."""

from __future__ import annotations

import asyncio
import json

import controller.engines.engine_keeper as keeper_module
from controller.engines.engine_keeper import EngineKeeper
from controller.engines.engine_pool import Engine, EnginePool, EngineState
from tests.controller.engines.fake_engines import FakeEngineActor, FakeTrainer


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


def _starting_pool(count: int) -> tuple[EnginePool, list[FakeEngineActor]]:
    actors = [FakeEngineActor(k) for k in range(count)]
    return EnginePool([Engine(k, a, "", state=EngineState.STARTING) for k, a in enumerate(actors)]), actors


def test_the_first_engines_join_as_their_starts_finish_each_worker_first_then_the_trainer_s_weights(
        tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(keeper_module, "PROBE_INTERVAL_S", 0.01)
    pool, actors = _starting_pool(2)
    events: list[str] = []
    slow_start = asyncio.Event()

    async def on_start(engine: Engine) -> None:
        events.append(f"worker {engine.index} ({engine.state})")

    async def changed() -> None:
        events.append(f"routes {pool.routable_urls()}")

    pool.on_start.append(on_start)
    pool.on_change.append(changed)

    async def begin(index: int, wait: asyncio.Event | None = None) -> Engine:
        if wait is not None:
            await wait.wait()
        return Engine(index, actors[index], f"http://e{index}", state=EngineState.STARTING)

    async def scenario() -> tuple[str, str]:
        keeper = EngineKeeper(pool, None, FakeTrainer(version=7), run_dir=tmp_path, no_engine_stop_s=0.05,
                              restart_pause_s=0)
        absent = asyncio.create_task(keeper.none_live())
        keeper.start([asyncio.ensure_future(begin(0, slow_start)), asyncio.ensure_future(begin(1))])
        while len(pool.live()) < 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # longer than no_engine_stop_s: still starting is no absence
        assert not absent.done() and pool.get(0).state is EngineState.STARTING
        slow_start.set()
        await asyncio.wait_for(keeper.joined(), 5)
        absent.cancel()
        await keeper.stop()
        return pool.get(0).state, pool.get(1).state

    assert asyncio.run(scenario()) == (EngineState.LIVE, EngineState.LIVE)
    # The faster start went live first; each engine's worker started before it took the trainer's newest weights.
    assert events == ["worker 1 (starting)", "routes ['http://e1']", "worker 0 (starting)",
                      "routes ['http://e0', 'http://e1']"]
    assert all(actor.loaded == [("blob-7", 7)] for actor in actors)
    assert all(engine.version == 7 for engine in pool.live())


def test_an_engine_that_cannot_start_stops_the_run_with_its_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(keeper_module, "PROBE_INTERVAL_S", 0.01)
    pool, _ = _starting_pool(1)

    async def failing() -> Engine:
        raise RuntimeError("vLLM could not load the model\nTraceback ...")

    async def scenario() -> str:
        keeper = EngineKeeper(pool, None, FakeTrainer(version=0), run_dir=tmp_path, no_engine_stop_s=60,
                              restart_pause_s=0)
        keeper.start([asyncio.ensure_future(failing())])
        reason = await asyncio.wait_for(keeper.none_live(), 5)
        await keeper.stop()
        return reason

    assert asyncio.run(scenario()) == "policy engine 0 did not start: vLLM could not load the model"


def test_admission_opens_once_an_engine_is_live(tmp_path) -> None:
    from controller.engines.engine_keeper import admit_once_an_engine_is_live
    from primitives.holds import HoldSet
    from schemas.names import ENGINES_STARTING_HOLDER

    pool, actors = _starting_pool(1)

    async def scenario() -> tuple[set, set]:
        admission = HoldSet("admission")
        admit_once_an_engine_is_live(pool, admission)
        await pool.changed()  # a change with none live yet keeps it closed
        before = set(admission.holders())
        pool.put(Engine(0, actors[0], "http://e0"))
        await pool.changed()
        return before, set(admission.holders())

    assert asyncio.run(scenario()) == ({ENGINES_STARTING_HOLDER}, set())


def test_an_engine_killed_while_it_started_is_replaced_like_any_dead_engine(tmp_path, monkeypatch) -> None:
    import ray.exceptions

    monkeypatch.setattr(keeper_module, "PROBE_INTERVAL_S", 0.01)
    pool, _ = _starting_pool(1)
    spawned: list[tuple[int, int]] = []

    async def killed() -> Engine:
        raise ray.exceptions.RayActorError()

    async def spawn(index: int, restarts: int) -> Engine:
        spawned.append((index, restarts))
        return Engine(index, FakeEngineActor(index), f"http://e{index}-r{restarts}", state=EngineState.STARTING)

    async def scenario() -> EngineKeeper:
        keeper = EngineKeeper(pool, spawn, FakeTrainer(version=4), run_dir=tmp_path, no_engine_stop_s=60,
                              restart_pause_s=0)
        keeper.start([asyncio.ensure_future(killed())])
        await asyncio.wait_for(keeper.joined(), 5)
        await keeper.stop()
        return keeper

    keeper = asyncio.run(scenario())
    assert keeper.join_failure is None and spawned == [(0, 1)]
    assert pool.routable_urls() == ["http://e0-r1"] and pool.get(0).version == 4

