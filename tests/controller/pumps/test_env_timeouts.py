"""Every call to an environment server has a time limit: a server that accepts the connection
and never answers ends the call with a reason naming the server's URL and the call, and
the router marks it away; `/run` is left to the rollout's own (pausable) deadline."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from turnkeep.controller.pumps.env_client import EnvClient, EnvTimeout
from turnkeep.controller.pumps.env_router import EnvRouter, EnvServerLink
from turnkeep.schemas.environments import JudgeRequest
from turnkeep.schemas.rollout import Problem, RolloutOutcome, RolloutRequest, RolloutResult

LIMIT_S = 0.3
BOUND_S = 5.0
"""A call that has not ended by then hangs: the test fails instead of waiting forever."""


@asynccontextmanager
async def hanging_server(answers: dict[str, object] | None = None, delays: dict[str, float] | None = None):
    """A server whose routes never answer, except those in `answers` (after `delays`); yields (url, seen)."""
    answers, delays = answers or {}, delays or {}
    release = asyncio.Event()
    seen: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        route = request.match_info["route"]
        seen.append(route)
        if route not in answers:
            await release.wait()  # hangs until the test ends
            return web.Response(status=504)
        await asyncio.sleep(delays.get(route, 0.0))
        return web.json_response(answers[route])

    app = web.Application()
    app.router.add_route("*", "/{route}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        release.set()
        await runner.cleanup()


def _request(rollout_id: str = "g.0.0") -> RolloutRequest:
    return RolloutRequest(rollout_id=rollout_id, group_id="g", sibling=0, attempt=0, problem=Problem(question="Q 1+1"))


async def _ends_within(call, bound_s: float = BOUND_S):
    return await asyncio.wait_for(call, bound_s)


def test_each_control_call_to_a_hung_server_times_out_naming_the_url_and_the_call(caplog):
    caplog.set_level(logging.WARNING, logger="turnkeep.env")

    async def scenario() -> None:
        async with hanging_server() as (url, _), aiohttp.ClientSession() as session:
            client = EnvClient(url, session, "t", "calc", control_timeout_s=LIMIT_S, attach_timeout_s=LIMIT_S,
                               judge_timeout_s=LIMIT_S)
            judge = JudgeRequest(group_id="g", problem=Problem(question="q"), policy_turns=[[[1]]])
            calls = {"ack": client.ack("receipt-1"), "cancel": client.cancel("g.0.0"),
                     "cancel_all": client.cancel_all(), "health": client.health(), "judge": client.judge(judge)}
            for route, call in calls.items():
                started = time.monotonic()
                with pytest.raises(EnvTimeout) as err:
                    await _ends_within(call)
                assert time.monotonic() - started < LIMIT_S + 2.0
                assert url in str(err.value) and f"/{route}" in str(err.value), err.value
                assert f"within {LIMIT_S:g}s" in str(err.value)

    asyncio.run(scenario())
    logged = [r.getMessage() for r in caplog.records if r.name == "turnkeep.env"]
    for route in ("ack", "cancel", "cancel_all", "health", "judge"):
        assert any(f"/{route}" in line and "did not answer" in line and "127.0.0.1" in line for line in logged), route


def test_run_is_bounded_by_the_rollouts_deadline_not_by_the_control_limit():
    """A rollout legitimately runs longer than a control call may take; only an explicit run limit ends it."""
    body = RolloutResult(rollout_id="g.0.0", outcome=RolloutOutcome.FAILED, reason="slow").model_dump(mode="json")

    async def scenario() -> None:
        async with hanging_server({"run": body}, {"run": 3 * LIMIT_S}) as (url, _), aiohttp.ClientSession() as s:
            client = EnvClient(url, s, "t", "calc", control_timeout_s=LIMIT_S)
            result = await _ends_within(client.run(_request()))
            assert result.reason == "slow"
            limited = EnvClient(url, s, "t", "calc", control_timeout_s=LIMIT_S, run_timeout_s=LIMIT_S)
            with pytest.raises(EnvTimeout, match=r"/run g\.0\.0 within"):
                await _ends_within(limited.run(_request()))

    asyncio.run(scenario())


def test_a_hung_ack_marks_the_server_away_and_the_next_ack_fails_at_once():
    async def scenario() -> None:
        async with hanging_server({"health": {"turn_commits": 0}}) as (url, _), aiohttp.ClientSession() as session:
            link = EnvServerLink(EnvClient(url, session, "t", "calc", control_timeout_s=LIMIT_S), ["calc"])
            router = EnvRouter([link])
            router._receipts["receipt-1"] = link
            try:
                with pytest.raises(EnvTimeout):
                    await _ends_within(router.ack("receipt-1"))
                assert link.away_since is not None and "/ack" in link.reason and url in link.reason
                assert any(url in line and "/ack" in line for line in router.away())
                # A snapshot's prepare waits for the ACKs in flight: while away, no retry waits.
                started = time.monotonic()
                with pytest.raises(Exception, match="is away"):
                    await _ends_within(router.ack("receipt-1"))
                assert time.monotonic() - started < 0.1
            finally:
                await router.close()

    asyncio.run(scenario())


def test_health_of_many_servers_costs_one_limit_and_leaves_the_hung_one_out():
    async def scenario() -> None:
        async with (hanging_server({"health": {"turn_commits": 3, "running": 1, "unacked": 0}}) as (good, _),
                    hanging_server() as (hung, _), hanging_server() as (hung2, _),
                    aiohttp.ClientSession() as session):
            links = [EnvServerLink(EnvClient(url, session, "t", name, control_timeout_s=LIMIT_S), [name])
                     for url, name in ((good, "a"), (hung, "b"), (hung2, "c"))]
            router = EnvRouter(links)
            try:
                started = time.monotonic()
                health = await _ends_within(router.health())
                assert time.monotonic() - started < 2 * LIMIT_S + 1.0  # asked at once, not one after another
                assert health["turn_commits"] == 3 and sorted(health["away"]) == ["b", "c"]
                assert "/health" in links[1].reason and hung in links[1].reason
            finally:
                await router.close()

    asyncio.run(scenario())


def test_the_default_limits_are_finite():
    client = EnvClient("http://127.0.0.1:9", None, "t")  # type: ignore[arg-type]
    assert 0 < client.control_timeout_s <= 30
    assert 0 < client.attach_timeout_s < float("inf") and 0 < client.judge_timeout_s < float("inf")
