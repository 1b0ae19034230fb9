"""Stand-ins for engine and trainer actors (a unit test of the pool and the keeper; the real ones are exercised by
tests/workers/test_engines.py)."""

from __future__ import annotations

import asyncio

import ray.exceptions


class _Call:
    def __init__(self, fn) -> None:
        self._fn = fn

    def remote(self, *args):
        return self._fn(*args)


class FakeEngineActor:
    def __init__(self, index: int) -> None:
        self.index = index
        self.dead = False
        self.loaded: list[tuple[object, int]] = []
        self.holders: set[str] = set()
        self.tokens = 0
        self.load_delay_s = 0.0
        self.stopped = False
        self.events: list[str] = []
        """What happened to this engine, in order (`loaded <version>`, `stopped`)."""
        self.probe_s: float | None = 0.01
        """What its liveness probe answers: the engine core's seconds for one token (None: not asked now)."""
        self.frozen = False
        """A frozen process: no call of it ever returns (a SIGSTOPped actor)."""

    def kill(self) -> None:
        self.dead = True

    async def _alive(self) -> None:
        if self.dead:
            raise ray.exceptions.RayActorError()

    def __getattr__(self, name: str):
        calls = {
            "__ray_ready__": self._ready, "load_weights": self._load, "close_admission": self._close,
            "open_admission": self._open, "admission_leases": self._leases, "drain": self._drain,
            "stop_temporal_worker": self._nothing, "stop": self._stop, "liveness": self._liveness,
            "kill_engine_processes": self._kill_engine_processes,
        }
        if name in calls:
            return _Call(calls[name])
        raise AttributeError(name)

    async def _liveness(self, timeout_s: float) -> float | None:
        await self._alive()
        if self.frozen:
            await asyncio.Event().wait()
        return self.probe_s

    async def _kill_engine_processes(self) -> int:
        await self._liveness(0)
        self.events.append("engine processes killed")
        return 1

    async def _ready(self) -> bool:
        await self._alive()
        return True

    async def _load(self, blob, version: int) -> dict:
        await self._alive()
        await asyncio.sleep(self.load_delay_s)
        if self.stopped:  # as the real server: a stopped engine has no vLLM to load into
            raise RuntimeError(f"policy engine {self.index} is stopped")
        self.loaded.append((blob, version))
        self.events.append(f"loaded {version}")
        return {"bytes": 10, "engine": self.index, "tokens_generated": self.tokens}

    async def _close(self, holder: str) -> bool:
        await self._alive()
        self.holders.add(holder)
        return True

    async def _open(self, holder: str) -> bool:
        await self._alive()
        self.holders.discard(holder)
        return True

    async def _drain(self, limit_s: float) -> None:
        await self._alive()

    async def _nothing(self) -> None:
        await self._alive()

    async def _stop(self) -> None:
        self.stopped = True
        self.events.append("stopped")

    async def _leases(self) -> list:
        await self._alive()
        return [(h, 5.0 + self.index) for h in sorted(self.holders)]


class FakeTrainer:
    def __init__(self, version: int) -> None:
        self.version = version
        self.versioned_weights = self

    def options(self, num_returns: int):
        assert num_returns == 2
        return self

    def remote(self):
        async def version() -> int:
            return self.version
        return version(), f"blob-{self.version}"
