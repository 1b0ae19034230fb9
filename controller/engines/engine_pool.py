"""The run's policy engines, as the controller reaches them: one handle per engine, and the calls that go to all.

Each engine is a Ray actor (`gpu_workers.policy_actor.PolicyActor`) with its own endpoint and its own Temporal
worker. What the controller does to "the policy" it does to every live engine at once (admission, weight loads),
so the run waits for the slowest engine, never for the sum. An engine that died is skipped by these calls: its
replacement is brought to the current version by `controller.engines.engine_keeper` before it takes turns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

import ray.exceptions

from turnkeep.schemas.names import ENGINES_REFIT_HOLDER

log = logging.getLogger("turnkeep.engines")


class EngineState(StrEnum):
    STARTING = "starting"
    """Being started or refitted; takes no turns yet."""
    LIVE = "live"
    """At the current policy version; agents' turns are routed to it."""
    RETIRING = "retiring"
    """Scaled away: takes no new turns, finishes the ones it has, then stops."""
    DEAD = "dead"
    """Its process is gone; a replacement takes its index."""


@dataclass
class Engine:
    index: int
    actor: object
    url: str
    state: EngineState = EngineState.LIVE
    version: int = 0
    """The policy version it serves."""
    restarts: int = 0
    """Replacements started for this index so far."""


class EngineGone(RuntimeError):
    """An engine's process died under a call; the engine keeper replaces it."""


class EnginePool:
    def __init__(self, engines: list[Engine]) -> None:
        self._engines: dict[int, Engine] = {e.index: e for e in engines}
        self.refit_lock = asyncio.Lock()
        """Held by every weight load: a replacement catching up and a train step's refit never interleave, so an
        engine goes live at the version the others serve."""
        self.on_change: list[Callable[[], Awaitable[None]]] = []
        """Called after the set of live engines changed (the routes go to the environment servers)."""
        self.on_start: list[Callable[[Engine], Awaitable[None]]] = []
        """Called for every engine started after the run's start, before it loads weights (its Temporal worker)."""

    # -- what the run has --------------------------------------------------------------

    @property
    def version(self) -> int:
        """The newest policy version a live engine serves."""
        return max((e.version for e in self.live()), default=0)

    def all(self) -> list[Engine]:
        return [self._engines[k] for k in sorted(self._engines)]

    def get(self, index: int) -> Engine | None:
        return self._engines.get(index)

    def live(self) -> list[Engine]:
        return [e for e in self.all() if e.state is EngineState.LIVE]

    def indices(self) -> list[int]:
        """Every engine the run keeps (live, starting or dead awaiting its replacement), not retiring ones."""
        return [e.index for e in self.all() if e.state is not EngineState.RETIRING]

    def routable_urls(self) -> list[str]:
        """Where agents' turns may go: the live engines (all at the current version)."""
        return [e.url for e in self.live()]

    def first(self) -> Engine:
        """The lowest-numbered live engine (any engine when none is live): one engine's view for logs and tests."""
        live = self.live()
        return live[0] if live else self.all()[0]

    def put(self, engine: Engine) -> None:
        self._engines[engine.index] = engine

    def drop(self, index: int) -> Engine | None:
        return self._engines.pop(index, None)

    async def changed(self) -> None:
        for hook in list(self.on_change):
            await hook()

    async def started(self, engine: Engine) -> None:
        for hook in list(self.on_start):
            await hook(engine)

    # -- calls to every live engine ------------------------------------------------------

    async def close_admission(self, holder: str) -> None:
        await self._each("close admission", lambda e: e.actor.close_admission.remote(holder))

    async def open_admission(self, holder: str) -> None:
        await self._each("open admission", lambda e: e.actor.open_admission.remote(holder))

    async def load_weights(self, blob, version: int) -> list[dict]:
        """`blob` (one Ray object ref) into every live engine in parallel: Ray hands each the same stored bytes
        (one serialization, shared memory on a node), not one copy made per engine here."""
        async with self.refit_lock:
            # Every gate stays closed until every engine has the new version: no engine takes a turn of it while
            # another still serves the old one (a single engine's load reopens its own gate when it is done).
            together = len(self.live()) > 1
            if together:
                await self.close_admission(ENGINES_REFIT_HOLDER)
            try:
                loaded = await self._each(f"load version {version}",
                                          lambda e: e.actor.load_weights.remote(blob, version))
            finally:
                if together:
                    await self.open_admission(ENGINES_REFIT_HOLDER)
            for engine, _ in loaded:
                engine.version = version
        return [result for _, result in loaded]

    async def catch_up(self, engine: Engine, trainer) -> None:
        """A new engine loads the trainer's newest weights, then is live. Under the refit lock, so no train step's
        refit interleaves; the trainer's version and bytes are taken together between its steps, so the engine's
        turns carry the version that generated them even when a step finished and its refit is still to come
        (that refit then reloads the same version into it, which an engine accepts)."""
        async with self.refit_lock:
            version_ref, blob = trainer.versioned_weights.options(num_returns=2).remote()
            version = await version_ref
            if version > 0:  # version 0 is the model's own weights, which the engine started with
                await engine.actor.load_weights.remote(blob, version)
            engine.version, engine.state = version, EngineState.LIVE

    async def admission_leases(self) -> list[tuple[str, float | None]]:
        """Every holder of any live engine's gate, with the shortest remaining lease across engines."""
        leases: dict[str, float | None] = {}
        for _, held in await self._each("admission leases", lambda e: e.actor.admission_leases.remote()):
            for holder, lease in held:
                mine = leases.get(holder, lease)
                leases[holder] = lease if mine is None else (mine if lease is None else min(mine, lease))
        return sorted(leases.items(), key=lambda item: item[0])

    async def _each(self, what: str, call) -> list[tuple[Engine, object]]:
        engines = self.live()
        results = await asyncio.gather(*(call(e) for e in engines), return_exceptions=True)
        done = []
        for engine, result in zip(engines, results, strict=True):
            if isinstance(result, ray.exceptions.RayActorError):
                # Its watcher marks it dead and starts a replacement; the replacement is refitted before it is live.
                log.info("engine %d died before it could %s", engine.index, what)
                continue
            if isinstance(result, BaseException):
                raise result
            done.append((engine, result))
        return done
