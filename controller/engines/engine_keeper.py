"""Keeps the run's engines live: a dead or hung engine is replaced, refitted to the current version, and routed to
again.

One watcher per engine index holds a pending `__ray_ready__` call on its actor (free while it lives, failing at once
when its process dies, as `workers.process_watch` does for the trainer), and probes its liveness every
`hang_s` / 4: a one-token request straight to the engine core (`PolicyActor.liveness`). An engine that answers in
`hang_s` neither the probe (its engine core is stuck: a hung kernel, a SIGSTOPped process) nor the call itself (its
actor's process is frozen) is killed by pid (its engine processes by its own actor when that still answers, then
the actor by Ray) and replaced as a dead one is, with one line and a `hang` line in metrics.jsonl. On a death the engine leaves the routes at
once (the environment servers send its interrupted turns to another engine, spending none of the rollouts'
attempts), a replacement is started on the same index (same task queue, same GPU bundle), loads the version the
others serve, and joins the routes. The run stops, with one line, only when no engine has been live for
`policy.no_engine_stop_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import ray
import ray.exceptions

from turnkeep.controller.engines.engine_pool import Engine, EnginePool, EngineState
from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.schemas.choices import MetricsKind

log = logging.getLogger("turnkeep.engines")

PROBE_INTERVAL_S = 1.0
HANG_PROBE_MAX_EVERY_S = 10.0
HANG_GRACE_S = 5.0
"""Beyond `hang_s`, how long the probe call itself may take (Ray's round trip) before the actor counts as frozen."""
RETIRE_STEP_S = 30.0
"""A retiring engine's worker stop and its own stop get this long each before it is killed."""

Spawn = Callable[[int, int], Awaitable[Engine]]
"""Start engine `index` (its `restarts`-th replacement): the actor, its endpoint and its Temporal worker."""


class EngineKeeper:
    def __init__(self, pool: EnginePool, spawn: Spawn, trainer, *, run_dir: Path,
                 no_engine_stop_s: float, restart_pause_s: float, hang_s: float | None = None) -> None:
        self._pool = pool
        self._spawn = spawn
        self._trainer = trainer
        """The trainer's actor: a replacement loads its newest weights (`TrainerActor.versioned_weights`)."""
        self._run_dir = run_dir
        self._no_engine_stop_s = no_engine_stop_s
        self._restart_pause_s = restart_pause_s
        self._hang_s = hang_s
        self._watchers: dict[int, asyncio.Task] = {}
        self._started = False
        self.restarts = 0

    @property
    def started(self) -> bool:
        """Keeping the engines (scaling waits for it: the keeper is built before the run's restore ends)."""
        return self._started

    def start(self) -> None:
        self._started = True
        for engine in self._pool.all():
            self.watch_engine(engine.index)

    def watch_engine(self, index: int) -> None:
        if index not in self._watchers or self._watchers[index].done():
            self._watchers[index] = asyncio.create_task(self._keep(index), name=f"engine-{index}")

    async def stop(self) -> None:
        watchers = list(self._watchers.values())
        # Python 3.11's wait_for swallows a cancel that lands as its inner call finishes (the probe's): a watcher
        # can go on after one cancel, so each is cancelled again until it has ended.
        while not all(task.done() for task in watchers):
            for task in watchers:
                task.cancel()
            await asyncio.wait(watchers, timeout=0.1)

    async def add(self, index: int) -> None:
        """Scale up: engine `index` started, refitted, live and routed to, then watched like the others."""
        engine = await self._spawn(index, 0)
        self._pool.put(engine)
        try:
            await self._pool.started(engine)
            await self._pool.catch_up(engine, self._trainer)
        except BaseException:
            self._pool.drop(index)
            await _stop_quietly(engine.actor)
            raise
        self.watch_engine(index)
        await self._pool.changed()

    async def retire(self, index: int, drain_s: float) -> None:
        """Scale down: engine `index` takes no new turns (the servers are told first), finishes the calls it
        accepted (up to `drain_s`), then stops."""
        engine = self._pool.get(index)
        if engine is None:
            return
        engine.state = EngineState.RETIRING
        await self._pool.changed()
        # Each step bounded: a call that does not finish fails over to another engine when the engine stops, and
        # the run's attempts wait for the scaling to end.
        for what, call, limit_s in (("drain", lambda: engine.actor.drain.remote(drain_s), drain_s + 5),
                                    ("stop its worker", engine.actor.stop_temporal_worker.remote, RETIRE_STEP_S)):
            try:
                await asyncio.wait_for(call(), limit_s)
            except (ray.exceptions.RayError, TimeoutError) as err:
                log.info("retiring engine %d: %s did not finish (%s); stopping it anyway", index, what,
                         type(err).__name__)
        # Under the refit lock: a refit that began while the engine was live loads into it first (a stopped engine
        # has no vLLM to load into, and its failure would stop the run); later refits no longer count it as live.
        async with self._pool.refit_lock:
            await _stop_quietly(engine.actor)
            self._pool.drop(index)
        if (watcher := self._watchers.pop(index, None)) is not None:
            watcher.cancel()

    async def none_live(self) -> str:
        """Resolves to the run's stop reason once no engine has been live for `no_engine_stop_s`."""
        since = None
        while True:
            if self._pool.live():
                since = None
            elif since is None:
                since = time.monotonic()
            elif time.monotonic() - since >= self._no_engine_stop_s:
                reason = (f"no policy engine has been live for {self._no_engine_stop_s:g}s (replacements keep "
                          "failing; see the engines' lines in the Ray logs); run the same command again to continue "
                          "from the last snapshot")
                log.error("%s", reason)
                return reason
            await asyncio.sleep(PROBE_INTERVAL_S)

    async def _keep(self, index: int) -> None:
        while (engine := self._pool.get(index)) is not None and engine.state is not EngineState.RETIRING:
            hang = await self._until_dead_or_hung(engine)
            if self._pool.get(index) is not engine or engine.state is EngineState.RETIRING:
                return  # scaled away, or already replaced
            if hang is not None:
                await self._kill_hung(engine, hang)
            died_at = time.monotonic()
            engine.state = EngineState.DEAD
            log.warning("policy engine %d (%s) died; its turns go to the other engines while a replacement starts",
                        index, engine.url)
            await self._pool.changed()
            await self._replace(engine, died_at)

    async def _until_dead_or_hung(self, engine: Engine) -> dict | None:
        """None once the engine's process died; what its probe saw once it hung."""
        dead = asyncio.ensure_future(_until_dead(engine.actor))
        try:
            while True:
                every = min(self._hang_s / 4, HANG_PROBE_MAX_EVERY_S) if self._hang_s else None
                done, _ = await asyncio.wait({dead}, timeout=every)
                if done:
                    return None
                if engine.state is EngineState.LIVE and (hang := await self._probe(engine)) is not None:
                    return hang
        finally:
            dead.cancel()

    async def _probe(self, engine: Engine) -> dict | None:
        try:
            waited = await asyncio.wait_for(engine.actor.liveness.remote(self._hang_s), self._hang_s + HANG_GRACE_S)
        except TimeoutError:
            return {"probe": "actor call", "why": f"its process did not answer a liveness call in "
                                                  f"{self._hang_s + HANG_GRACE_S:g}s"}
        except ray.exceptions.RayError:
            return None  # dead (the death watch sees it) or failing on its own: not a hang
        if waited is not None and waited >= self._hang_s:
            return {"probe": "engine core token", "why": f"its engine core generated no token for a probe request "
                                                         f"(or finished no weight load) in {self._hang_s:g}s"}
        return None

    async def _kill_hung(self, engine: Engine, hang: dict) -> None:
        """Kill the hung engine for good, so it cannot come back half-way: its engine processes by its own actor
        when that still answers, then the actor by Ray."""
        try:
            killed = await asyncio.wait_for(engine.actor.kill_engine_processes.remote(), 2 * HANG_GRACE_S)
        except (ray.exceptions.RayError, TimeoutError):
            killed = 0
        try:
            ray.kill(engine.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        log.warning("policy engine %d (%s) hung: %s; killed (%d engine process(es), then its actor) and replaced as "
                    "a dead one", engine.index, engine.url, hang["why"], killed)
        append_jsonl(self._run_dir / "metrics.jsonl", {
            "kind": MetricsKind.HANG, "t": round(time.time(), 3), "target": f"engine {engine.index}",
            "probe": hang["probe"], "hang_s": self._hang_s, "why": hang["why"]}, durable=False)
        await _until_dead(engine.actor)

    async def _replace(self, dead: Engine, died_at: float) -> None:
        restarts = dead.restarts
        while True:
            restarts += 1
            try:
                fresh = await self._spawn(dead.index, restarts)
                await self._pool.started(fresh)
                await self._pool.catch_up(fresh, self._trainer)
            except (ray.exceptions.RayError, OSError, RuntimeError) as err:
                log.warning("replacement %d of engine %d failed (%s); trying again in %.0fs", restarts, dead.index,
                            str(err).splitlines()[0] if str(err) else type(err).__name__, self._restart_pause_s)
                await asyncio.sleep(self._restart_pause_s)
                continue
            break
        self._pool.put(fresh)
        self.restarts += 1
        replaced_s = round(time.monotonic() - died_at, 3)
        log.info("policy engine %d is live again at %s (version %d, %.1fs after it died)", dead.index, fresh.url,
                 fresh.version, replaced_s)
        append_jsonl(self._run_dir / "metrics.jsonl", {
            "kind": MetricsKind.ENGINE_RESTART, "t": round(time.time(), 3), "engine": dead.index,
            "restarts": self.restarts, "url": fresh.url, "seconds": replaced_s}, durable=False)
        await self._pool.changed()


async def _stop_quietly(actor) -> None:
    try:
        await asyncio.wait_for(actor.stop.remote(), RETIRE_STEP_S)
    except (ray.exceptions.RayError, TimeoutError):
        pass  # gone already, or hung: the kill below ends it
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


async def _until_dead(actor) -> None:
    while True:
        try:
            await actor.__ray_ready__.remote()
        except ray.exceptions.RayActorError:
            return
        await asyncio.sleep(PROBE_INTERVAL_S)


def engine_keeper(processes, *, run_dir: Path, no_engine_stop_s: float, restart_pause_s: float,
                  hang_s: float | None = None) -> EngineKeeper:
    """The keeper of `processes`' engines, not yet keeping them (`keep_engines` starts it)."""
    return EngineKeeper(processes.engines, processes.spawn_engine, processes.trainer, run_dir=run_dir,
                        no_engine_stop_s=no_engine_stop_s, restart_pause_s=restart_pause_s, hang_s=hang_s)


def keep_engines(keeper: EngineKeeper, processes, session) -> None:
    """Watch every engine of `processes`, replace the ones that die, and tell the environment servers each time
    the live set changes."""
    from turnkeep.controller.engines.engine_routes import push_routes

    pool = processes.engines

    async def tell_servers() -> None:
        await push_routes(processes.env_servers, session, pool.routable_urls())

    pool.on_change.append(tell_servers)
    keeper.start()
