"""The run's own environment server, gone for good, is started again by the router's probe on the
same port; the rollouts that waited for it go on, and a revive that fails is retried, not fatal."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
from aiohttp import web

from turnkeep.controller.pumps import env_router
from turnkeep.controller.pumps.env_client import EnvClient
from turnkeep.controller.pumps.env_router import EnvRouter, EnvServerLink


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _serve(port: int) -> web.AppRunner:
    app = web.Application()
    app.router.add_get("/health", lambda request: web.json_response({"turn_commits": 0, "running": 0}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def test_a_dead_server_of_the_run_is_started_again_and_its_waiters_go_on(monkeypatch) -> None:
    monkeypatch.setattr(env_router, "PROBE_S", 0.05)
    monkeypatch.setattr(env_router, "REVIVE_AFTER_S", 0.3)
    port = _free_port()

    async def scenario() -> None:
        runners = [await _serve(port)]
        revives: list[float] = []

        async def revive(why: str) -> None:
            revives.append(asyncio.get_running_loop().time())
            if len(revives) == 1:
                raise RuntimeError("the first restart fails")  # retried by the probe, not fatal
            runners.append(await _serve(port))

        async with aiohttp.ClientSession() as session:
            link = EnvServerLink(EnvClient(f"http://127.0.0.1:{port}", session, "t", "env"), ["calc"], revive=revive)
            router = EnvRouter([link])
            await runners[0].cleanup()  # the process dies
            health = await router.health()
            assert health["away"] == ["env"] and not link.back.is_set()
            await asyncio.wait_for(router.wait_available("calc"), 10)
            assert len(revives) == 2 and revives[1] - revives[0] >= 0.3
            assert (await router.health())["away"] == []
            await router.close()
        await runners[-1].cleanup()

    asyncio.run(scenario())


def test_a_stand_alone_server_is_never_started_by_the_run(monkeypatch) -> None:
    monkeypatch.setattr(env_router, "PROBE_S", 0.05)
    monkeypatch.setattr(env_router, "REVIVE_AFTER_S", 0.1)
    port = _free_port()

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            link = EnvServerLink(EnvClient(f"http://127.0.0.1:{port}", session, "t", "remote"), ["calc"])
            router = EnvRouter([link])
            await router.health()
            await asyncio.sleep(0.5)
            assert link.away_since is not None and link.revived_at is None
            await router.close()

    asyncio.run(scenario())


def test_an_absence_is_warned_of_once_and_only_after_absence_warn_s(monkeypatch, caplog) -> None:
    monkeypatch.setattr(env_router, "PROBE_S", 0.05)
    port = _free_port()

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            link = EnvServerLink(EnvClient(f"http://127.0.0.1:{port}", session, "t", "remote"), ["calc"])
            router = EnvRouter([link], absence_warn_s=0.5)
            await router.health()
            assert router.is_away("calc")
            await asyncio.sleep(0.3)
            assert not [r for r in caplog.records if r.levelname == "WARNING"]  # a restart is over within seconds
            await asyncio.sleep(0.6)
            await router.close()

    with caplog.at_level("INFO", logger="turnkeep.env"):
        asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "has been away for" in warnings[0], warnings
    assert any("stopped answering" in r.getMessage() for r in caplog.records if r.levelname == "INFO")
