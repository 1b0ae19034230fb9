"""The environment server's client-side router over N policy engines, against real aiohttp servers standing in
for the engines: fewest outstanding calls first, a rollout sticks to its engine, a failed engine (dropped
connection, 5xx) is left out and the same request answered elsewhere, a 4xx is the caller's, and a call with no
routable engine waits for the controller's list (or times out)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from aiohttp import web

from turnkeep.envs.engine_router import EngineRouter
from turnkeep.envs.policy_client import PolicyCallError
from turnkeep.envs.streamed_turn import StreamedTurn
from turnkeep.schemas.policy import (
    CompletionChoice,
    CompletionDelta,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamLine,
)

HOLD = 999
"""A prompt starting with this token waits at the engine until the test opens its gate."""


class FakeEngine:
    """An engine's `/v1/completions`: answers `tokens` copies of its own token id, or `status` with an error."""

    def __init__(self, token: int, tokens: int = 3) -> None:
        self.token, self.tokens = token, tokens
        self.status = 200
        self.received = 0
        self.requests: list[CompletionRequest] = []
        self.fail_after: int | None = None
        """A streamed call breaks off after this many tokens (the engine's core died mid-turn)."""
        self.gate = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        # A short shutdown: a stopped engine drops the calls it holds instead of finishing them.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _complete(self, http: web.Request) -> web.StreamResponse:
        request = CompletionRequest.model_validate_json(await http.read())
        self.received += 1
        self.requests.append(request)
        if request.prompt[0] == HOLD:
            await self.gate.wait()
        if self.status != 200:
            return web.json_response({"error": {"message": "engine trouble"}}, status=self.status)
        if request.stream:
            return await self._stream(http, request)
        ids = [self.token] * self.tokens
        choice = CompletionChoice(text="", token_ids=ids, logprobs=CompletionLogprobs(token_logprobs=[-1.0] * len(ids)),
                                  finish_reason="stop")
        return web.Response(text=CompletionResponse(id="x", choices=[choice], policy_version=1).model_dump_json(),
                            content_type="application/json")


    async def _stream(self, http: web.Request, request: CompletionRequest) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(http)
        sent = []
        for _ in range(min(self.tokens, request.max_tokens)):
            if self.fail_after is not None and len(sent) == self.fail_after:
                line = CompletionStreamLine(error="EngineDeadError: the engine core died")
                await response.write(line.model_dump_json(exclude_none=True).encode() + b"\n")
                return response
            sent.append(self.token)
            delta = CompletionDelta(token_ids=[self.token], token_logprobs=[-1.0], policy_version=self.token)
            await response.write(CompletionStreamLine(delta=delta).model_dump_json(exclude_none=True).encode() + b"\n")
        done = CompletionStreamLine(finish_reason="length")
        await response.write(done.model_dump_json(exclude_none=True).encode() + b"\n")
        return response


def call(held: bool = False) -> CompletionRequest:
    return CompletionRequest(prompt=[HOLD if held else 1, 2], max_tokens=4)


def engine_of(response: CompletionResponse) -> int:
    return response.choices[0].token_ids[0]


async def until(predicate, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


def with_engines(count: int, test):
    """Run `test(router, engines, session)` with `count` started fake engines, tokens 1..count, in list order."""

    async def scenario() -> None:
        engines = [FakeEngine(token) for token in range(1, count + 1)]
        for engine in engines:
            await engine.start()
        try:
            async with aiohttp.ClientSession() as session:
                await test(EngineRouter([e.url for e in engines], session), engines, session)
        finally:
            for engine in engines:
                engine.gate.set()
                await engine.stop()

    asyncio.run(scenario())


def counters(router: EngineRouter, engine: FakeEngine, key: str) -> int:
    return router.stats()["engines"][engine.url.rstrip("/")][key]


def test_fewest_outstanding_spreads_concurrent_calls_over_two_engines():
    async def test(router: EngineRouter, engines: list[FakeEngine], _) -> None:
        calls = [asyncio.create_task(router.complete(call(held=True))) for _ in range(4)]
        await until(lambda: [e.received for e in engines] == [2, 2])
        assert [counters(router, e, "outstanding") for e in engines] == [2, 2]
        for engine in engines:
            engine.gate.set()
        answered = [engine_of(r) for r in await asyncio.gather(*calls)]
        assert sorted(answered) == [1, 1, 2, 2]
        totals = router.stats()["totals"]
        assert (totals["calls"], totals["outstanding"], totals["completion_tokens"], totals["failovers"]) == (4, 0, 12, 0)

    with_engines(2, test)


def test_a_rollout_sticks_to_its_engine_until_forgotten():
    async def test(router: EngineRouter, engines: list[FakeEngine], _) -> None:
        busy = asyncio.create_task(router.complete(call(held=True)))  # engine 1 busy: r1 starts on engine 2
        await until(lambda: engines[0].received == 1)
        assert engine_of(await router.complete(call(), rollout_id="r1")) == 2
        engines[0].gate.set()
        await busy
        # Both idle now: the tie would go to engine 1, but r1's conversation is cached on engine 2.
        assert [engine_of(await router.complete(call(), rollout_id="r1")) for _ in range(3)] == [2, 2, 2]
        assert engine_of(await router.complete(call(), rollout_id="r2")) == 1
        router.forget("r1")
        assert engine_of(await router.complete(call(), rollout_id="r1")) == 1
        assert router.stats()["totals"]["sticky_rollouts"] == 2

    with_engines(2, test)


def test_the_sticky_map_forgets_the_least_recently_used_rollout_beyond_its_cap():
    async def test(_, engines: list[FakeEngine], session: aiohttp.ClientSession) -> None:
        router = EngineRouter([e.url for e in engines], session, sticky_cap=2)
        for rollout in ("a", "b", "a", "c"):
            await router.complete(call(), rollout_id=rollout)
        assert router.stats()["totals"]["sticky_rollouts"] == 2
        assert list(router._sticky) == ["a", "c"]  # b was used least recently

    with_engines(2, test)


def test_an_engine_stopped_mid_call_hands_the_call_to_the_other_and_takes_no_more(caplog):
    async def test(router: EngineRouter, engines: list[FakeEngine], _) -> None:
        first, second = engines
        second.gate.set()
        pending = asyncio.create_task(router.complete(call(held=True), rollout_id="r1"))
        await until(lambda: first.received == 1)
        await first.stop()  # drops the held call's connection
        assert engine_of(await pending) == 2
        assert [engine_of(await router.complete(call(), rollout_id=f"n{i}")) for i in range(3)] == [2, 2, 2]
        assert (counters(router, first, "calls"), counters(router, first, "failovers")) == (1, 1)
        assert not router.stats()["engines"][first.url.rstrip("/")]["routable"]
        assert counters(router, second, "calls") == 4

    with caplog.at_level(logging.WARNING, logger="turnkeep.env.router"):
        with_engines(2, test)
    assert len(caplog.records) == 1 and "is down" in caplog.records[0].getMessage()


@pytest.mark.parametrize("status", [500, 503])
def test_a_5xx_fails_over_and_the_engine_is_out_until_the_controller_names_it_again(status, caplog):
    async def test(router: EngineRouter, engines: list[FakeEngine], _) -> None:
        first, second = engines
        first.status = status
        # Two calls wait on engine 1 and one on engine 2; engine 1 then fails both: one warning for the engine.
        calls = [asyncio.create_task(router.complete(call(held=True))) for _ in range(3)]
        await until(lambda: (first.received, second.received) == (2, 1))
        first.gate.set()
        await until(lambda: second.received == 3)
        second.gate.set()
        assert [engine_of(r) for r in await asyncio.gather(*calls)] == [2, 2, 2]
        assert counters(router, first, "failovers") == 2
        first.status = 200
        assert engine_of(await router.complete(call())) == 2  # still out: only the controller brings it back
        router.set_engines([first.url, second.url])
        assert engine_of(await router.complete(call())) == 1

    with caplog.at_level(logging.WARNING, logger="turnkeep.env.router"):
        with_engines(2, test)
    assert [r.getMessage().count(" is down") for r in caplog.records] == [1]


def test_a_4xx_is_the_callers_fault_and_raises_at_once():
    async def test(router: EngineRouter, engines: list[FakeEngine], _) -> None:
        engines[0].status = 400
        with pytest.raises(PolicyCallError, match="HTTP 400"):
            await router.complete(call())
        assert [e.received for e in engines] == [1, 0]
        assert router.stats()["totals"]["routable"] == 2

    with_engines(2, test)


def test_a_call_that_fails_on_every_engine_it_may_try_fails_the_rollout():
    async def test(_, engines: list[FakeEngine], session: aiohttp.ClientSession) -> None:
        for engine in engines:
            engine.status = 500
        router = EngineRouter([e.url for e in engines], session, max_engine_failures=2)
        with pytest.raises(PolicyCallError, match="failed on 2 policy engines"):
            await router.complete(call())

    with_engines(2, test)


def test_with_no_routable_engine_a_call_waits_for_the_controllers_list():
    async def test(_, engines: list[FakeEngine], session: aiohttp.ClientSession) -> None:
        first, second = engines
        first.status = 503
        router = EngineRouter([first.url], session)
        pending = asyncio.create_task(router.complete(call(), rollout_id="r1"))
        await until(lambda: first.received == 1)
        await asyncio.sleep(0.1)
        assert not pending.done() and router.stats()["totals"]["routable"] == 0
        router.set_engines([second.url])
        assert engine_of(await pending) == 2
        assert router.stats()["totals"]["failovers"] == 1

    with_engines(2, test)


def test_a_wait_for_an_engine_times_out_with_a_policy_call_error():
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            router = EngineRouter([], session, wait_for_engine_s=0.1)
            with pytest.raises(PolicyCallError, match="no policy engine was routable for 0.1s"):
                await router.complete(call())

    asyncio.run(scenario())


def test_the_router_takes_a_list_not_one_url():
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(TypeError, match="list of engine URLs"):
                EngineRouter("http://127.0.0.1:9", session)

    asyncio.run(scenario())


def test_a_turn_cut_mid_stream_is_finished_by_the_next_engine_from_its_tokens():
    async def test(router: EngineRouter, engines: list[FakeEngine], _) -> None:
        first, second = engines
        first.tokens = second.tokens = 5
        first.fail_after = 2
        arrived: list[list[int]] = []
        turn = StreamedTurn(CompletionRequest(prompt=[1, 2], max_tokens=5), on_tokens=lambda ids, *_: arrived.append(ids))
        await router.stream(turn, rollout_id="r1")
        # Engine 2 got the conversation plus engine 1's two tokens, and was asked for the three left.
        assert (second.requests[0].prompt, second.requests[0].max_tokens) == ([1, 2, 1, 1], 3)
        assert turn.token_ids == [1, 1, 2, 2, 2] and arrived == [[1], [1], [2], [2], [2]]
        segment = turn.segment()
        assert (segment.policy_version, segment.token_versions) == (2, [1, 1, 2, 2, 2])
        assert counters(router, first, "failovers") == 1
        assert (counters(router, first, "completion_tokens"), counters(router, second, "completion_tokens")) == (2, 3)

    with_engines(2, test)
