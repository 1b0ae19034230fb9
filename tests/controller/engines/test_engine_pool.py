"""What the controller does to "the policy" it does to every live engine at once; a dead one is skipped."""

from __future__ import annotations

import asyncio
import time

from tests.controller.engines.fake_engines import FakeEngineActor, FakeTrainer
from turnkeep.controller.engines.engine_pool import Engine, EnginePool, EngineState


def _pool(n: int) -> tuple[EnginePool, list[FakeEngineActor]]:
    actors = [FakeEngineActor(k) for k in range(n)]
    return EnginePool([Engine(k, a, f"http://e{k}") for k, a in enumerate(actors)]), actors


def test_one_blob_reaches_every_engine_in_parallel() -> None:
    pool, actors = _pool(3)
    for actor in actors:
        actor.load_delay_s = 0.3
    began = time.monotonic()
    results = asyncio.run(pool.load_weights("the-one-ref", 4))
    # In parallel: about one load's time, not three.
    assert time.monotonic() - began < 0.6
    assert [a.loaded for a in actors] == [[("the-one-ref", 4)]] * 3
    assert [r["engine"] for r in results] == [0, 1, 2] and pool.version == 4
    assert [e.version for e in pool.all()] == [4, 4, 4]


def test_a_dead_engine_is_skipped_not_fatal() -> None:
    pool, actors = _pool(2)
    actors[1].kill()
    asyncio.run(pool.close_admission("snapshot:x"))
    assert actors[0].holders == {"snapshot:x"}
    assert [r["engine"] for r in asyncio.run(pool.load_weights("b", 1))] == [0]


def test_only_live_engines_are_routable_and_fenced() -> None:
    pool, _ = _pool(3)
    pool.get(1).state = EngineState.STARTING
    pool.get(2).state = EngineState.RETIRING
    assert pool.routable_urls() == ["http://e0"]
    assert pool.indices() == [0, 1]  # a starting engine is the run's; a retiring one is going


def test_admission_holders_merge_with_the_shortest_lease() -> None:
    pool, _ = _pool(2)
    asyncio.run(pool.close_admission("snapshot:x"))
    assert asyncio.run(pool.admission_leases()) == [("snapshot:x", 5.0)]


def test_a_new_engine_loads_the_trainers_newest_version_before_it_is_live() -> None:
    pool, _ = _pool(1)
    fresh = FakeEngineActor(1)
    engine = Engine(1, fresh, "http://e1", state=EngineState.STARTING)
    pool.put(engine)
    asyncio.run(pool.catch_up(engine, FakeTrainer(version=7)))
    assert fresh.loaded == [("blob-7", 7)] and engine.state is EngineState.LIVE and engine.version == 7
    at_start = Engine(2, FakeEngineActor(2), "http://e2", state=EngineState.STARTING)
    asyncio.run(pool.catch_up(at_start, FakeTrainer(version=0)))
    assert at_start.actor.loaded == [] and at_start.state is EngineState.LIVE  # the model's own weights


def test_no_engine_reopens_before_every_engine_has_the_new_version() -> None:
    pool, actors = _pool(2)
    actors[1].load_delay_s = 0.2
    order: list[str] = []
    for actor in actors:
        load, reopen = actor._load, actor._open

        async def logged_load(blob, version, load=load, k=actor.index):
            result = await load(blob, version)
            order.append(f"loaded {k}")
            return result

        async def logged_open(holder, reopen=reopen, k=actor.index):
            order.append(f"open {k} {holder}")
            return await reopen(holder)

        actor._load, actor._open = logged_load, logged_open
    asyncio.run(pool.load_weights("b", 2))
    assert order[:2] == ["loaded 0", "loaded 1"] and sorted(order[2:]) == [
        "open 0 refit:all-engines", "open 1 refit:all-engines"]
    assert all(not actor.holders for actor in actors)
