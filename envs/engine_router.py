"""Client-side routing of the agents' policy calls over the run's N policy engines (no proxy, no extra hop).

Each call goes to the routable engine with the fewest calls this router has in flight to it, ties to the
first in the controller's list; a rollout stays on the engine it last used while that engine is routable,
so its growing conversation keeps hitting the engine whose prefix cache holds it. An engine that drops a
call or answers 5xx is taken out locally and the same request goes to another engine: the turn was not
committed, so the agent never sees it. The controller's `set_engines` list is the only way back in.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

import aiohttp

from turnkeep.envs.policy_client import EngineFailed, PolicyCallError, PolicyClient
from turnkeep.envs.streamed_turn import StreamedTurn
from turnkeep.schemas.policy import CompletionRequest, CompletionResponse

log = logging.getLogger("turnkeep.env.router")

STICKY_CAP = 4096
"""Rollouts whose engine the router remembers; the least recently used is forgotten first."""
MAX_ENGINE_FAILURES = 4
"""Engines one call may fail on before it fails the rollout: a request that kills every engine it reaches
must not take the whole fleet down."""


@dataclass
class _Engine:
    client: PolicyClient
    outstanding: int = 0
    calls: int = 0
    completion_tokens: int = 0
    failovers: int = 0

    def counters(self) -> dict[str, int]:
        return {"outstanding": self.outstanding, "calls": self.calls, "completion_tokens": self.completion_tokens,
                "failovers": self.failovers}


class EngineRouter:
    def __init__(self, urls: list[str], session: aiohttp.ClientSession, wait_for_engine_s: float = 300.0, *,
                 sticky_cap: int = STICKY_CAP, max_engine_failures: int = MAX_ENGINE_FAILURES) -> None:
        """`wait_for_engine_s`: how long a call waits for `set_engines` to name an engine when none is routable."""
        self._session = session
        self._wait_s = wait_for_engine_s
        self._sticky_cap = sticky_cap
        self._max_failures = max_engine_failures
        self._engines: dict[str, _Engine] = {}
        self._routable: list[str] = []
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._changed = asyncio.Event()
        self.set_engines(urls)

    def set_engines(self, urls: list[str]) -> None:
        """The controller's routable engines (live, at the current policy version), in tie-breaking order.

        Engines left out take no new calls (their calls in flight finish); named ones are up again, even one
        this router took out after a failure."""
        if isinstance(urls, str):
            raise TypeError("set_engines takes a list of engine URLs, not one URL")
        routable = list(dict.fromkeys(_base(url) for url in urls))
        for url in routable:
            if url not in self._engines:
                self._engines[url] = _Engine(PolicyClient(url, self._session))
        self._routable = routable
        self._wake_waiters()

    def forget(self, rollout_id: str) -> None:
        """The rollout ended: its engine need not be remembered."""
        self._sticky.pop(rollout_id, None)

    async def complete(self, request: CompletionRequest, *, rollout_id: str | None = None) -> CompletionResponse:
        """Answer on one engine, moving the same request to another one when an engine fails it.

        Raises PolicyCallError for a request an engine refuses (4xx), when no engine is routable for
        `wait_for_engine_s`, or when the call failed on `max_engine_failures` engines."""
        failures: list[str] = []
        while True:
            url = await self._engine_for(rollout_id)
            try:
                return await self._call(url, request)
            except EngineFailed as err:
                self._fail(url, err)
                failures.append(str(err))
            if len(failures) >= self._max_failures:
                raise PolicyCallError(f"the call failed on {len(failures)} policy engines; the last: {failures[-1]}")

    async def stream(self, turn: StreamedTurn, *, rollout_id: str | None = None) -> None:
        """As `complete`, streamed: an engine that fails mid-turn leaves its tokens in `turn`, and the next engine
        generates only the rest of the turn."""
        failures: list[str] = []
        while True:
            url = await self._engine_for(rollout_id)
            engine = self._engines[url]
            engine.outstanding += 1
            engine.calls += 1
            before = len(turn.token_ids)
            try:
                return await engine.client.stream(turn, rollout_id=rollout_id)
            except EngineFailed as err:
                self._fail(url, err)
                failures.append(str(err))
            finally:
                engine.outstanding -= 1
                engine.completion_tokens += len(turn.token_ids) - before
            if len(failures) >= self._max_failures:
                raise PolicyCallError(f"the call failed on {len(failures)} policy engines; the last: {failures[-1]}")

    def stats(self) -> dict:
        """Per engine URL its counters and whether it is routable, and the totals over every engine."""
        engines = {url: {**engine.counters(), "routable": url in self._routable}
                   for url, engine in self._engines.items()}
        totals = {key: sum(engine[key] for engine in engines.values())
                  for key in ("outstanding", "calls", "completion_tokens", "failovers")}
        totals.update(engines=len(engines), routable=len(self._routable), sticky_rollouts=len(self._sticky))
        return {"engines": engines, "totals": totals}

    async def _engine_for(self, rollout_id: str | None) -> str:
        url = self._choose(rollout_id)
        if url is not None:
            return url
        try:
            async with asyncio.timeout(self._wait_s):
                while (url := self._choose(rollout_id)) is None:
                    await self._changed.wait()
        except TimeoutError:
            raise PolicyCallError(
                f"no policy engine was routable for {self._wait_s:g}s (every engine failed or the controller "
                f"named none; known: {', '.join(self._engines) or 'none'})") from None
        return url

    def _choose(self, rollout_id: str | None) -> str | None:
        if not self._routable:
            return None
        if rollout_id is not None and self._sticky.get(rollout_id) in self._routable:
            self._sticky.move_to_end(rollout_id)
            return self._sticky[rollout_id]
        # min() keeps the first of equals: ties go to the controller's order, deterministically.
        url = min(self._routable, key=lambda u: self._engines[u].outstanding)
        if rollout_id is not None:
            self._remember(rollout_id, url)
        return url

    def _remember(self, rollout_id: str, url: str) -> None:
        self._sticky[rollout_id] = url
        self._sticky.move_to_end(rollout_id)
        while len(self._sticky) > self._sticky_cap:
            self._sticky.popitem(last=False)

    async def _call(self, url: str, request: CompletionRequest) -> CompletionResponse:
        engine = self._engines[url]
        engine.outstanding += 1
        engine.calls += 1
        try:
            response = await engine.client.complete(request)
        finally:
            engine.outstanding -= 1
        engine.completion_tokens += sum(len(choice.token_ids) for choice in response.choices)
        return response

    def _fail(self, url: str, err: EngineFailed) -> None:
        self._engines[url].failovers += 1
        if url not in self._routable:
            return  # already out (an earlier call failed on it, or the controller left it out): said once
        self._routable.remove(url)
        log.warning("policy engine %s is down, no new calls go to it until the controller names it again "
                    "(%d engines routable): %s", url, len(self._routable), err)

    def _wake_waiters(self) -> None:
        # Every waiter re-checks the list; a fresh event makes the next wait block again.
        self._changed.set()
        self._changed = asyncio.Event()


def _base(url: str) -> str:
    return url.rstrip("/")
