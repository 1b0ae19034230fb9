"""The participant client against real routes (a scripted participant over HTTP): auth,
bad bodies, fault injection, and how every failure maps to an error kind."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from turnkeep.participants.client import ParticipantClient
from turnkeep.participants.core import ParticipantCore, Quiescence
from turnkeep.participants.errors import ParticipantInvariantBroken, ParticipantRefused, ParticipantUnavailable
from turnkeep.participants.http_server import ControlAuth, add_participant_routes
from turnkeep.schemas.participant import Capabilities, FaultPlan, ParticipantState

TOKEN = "s3cret-token"


class Hooks:
    def __init__(self) -> None:
        self.counts = Quiescence(ready=True)

    def on_prepare(self, checkpoint_id: str, lease_s: float) -> None:
        pass

    def on_release(self, checkpoint_id: str) -> None:
        pass

    def status_counts(self) -> Quiescence:
        return self.counts

    async def write(self, directory: Path) -> tuple[list[Path], dict[str, int]]:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "a.bin").write_bytes(b"x" * 10)
        return [directory / "a.bin"], {"n": 1}


@asynccontextmanager
async def serve(app: web.Application):
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            yield f"http://127.0.0.1:{port}", session
    finally:
        await runner.cleanup()


def participant_app() -> web.Application:
    app = web.Application()
    core = ParticipantCore(Capabilities(name="p", kind="policy", saves_state=True), Hooks())
    add_participant_routes(app, core, ControlAuth(TOKEN, where="/runs/x/control_token"), fault_injection=True)
    return app


def test_protocol_round_trip_and_refusals(tmp_path) -> None:
    async def scenario() -> None:
        async with serve(participant_app()) as (url, session):
            client = ParticipantClient("p", url, TOKEN, session, timeout_s=5)
            assert (await client.capabilities()).name == "p"

            async with session.get(f"{url}/checkpoint/status") as resp:
                body = await resp.json()
                assert resp.status == 401 and body["code"] == "unauthorized"
                assert "/runs/x/control_token" in body["error"]
            with pytest.raises(ParticipantRefused, match="control_token") as info:
                await ParticipantClient("p", url, "wrong", session).prepare("A", 5)
            assert info.value.code == "unauthorized"

            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with session.post(f"{url}/checkpoint/prepare", json={"checkpoint_id": "A"}, headers=headers) as resp:
                body = await resp.json()
                assert resp.status == 400 and body["code"] == "bad_request" and "lease_s" in body["error"]
                assert body["checkpoint_id"] == "A"

            status = await client.prepare("A", 5)
            assert status.state is ParticipantState.PREPARED and status.checkpoint_id == "A"
            assert (await client.renew("A", 5)).lease_remaining_s > 4
            with pytest.raises(ParticipantInvariantBroken, match="prepared for checkpoint A, not B"):
                await client.status("B")
            with pytest.raises(ParticipantRefused) as info:
                await client.commit("A", tmp_path / "wrong-name")
            assert info.value.code == "bad_request"

            result = await client.commit("A", tmp_path / "p")
            assert [(a.path, a.bytes) for a in result.artifacts] == [("p/a.bin", 10)]
            assert (await client.resume("A")).changed
            assert not (await client.abort("A")).changed
            with pytest.raises(ParticipantRefused) as info:
                await client.commit("A", tmp_path / "p")
            assert info.value.code == "released"

    asyncio.run(scenario())


def test_injected_faults_are_retryable(tmp_path) -> None:
    async def scenario() -> None:
        async with serve(participant_app()) as (url, session):
            client = ParticipantClient("p", url, TOKEN, session, timeout_s=0.3)
            await client.prepare("A", 5)
            await client.set_faults(FaultPlan(fail={"commit": 1}, enospc={"commit": 1}))
            with pytest.raises(ParticipantUnavailable, match="HTTP 500") as info:
                await client.commit("A", tmp_path / "p")
            assert info.value.retryable
            with pytest.raises(ParticipantUnavailable, match="No space left") as info:
                await client.commit("A", tmp_path / "p")
            assert info.value.code == "io_error"
            assert (await client.commit("A", tmp_path / "p")).artifacts  # the retry goes through

            await client.set_faults(FaultPlan(delay_s={"resume": 0.8}))
            with pytest.raises(ParticipantUnavailable, match="TimeoutError"):
                await client.resume("A")
            await client.set_faults(FaultPlan())
            await asyncio.sleep(0.7)  # the slow resume still lands on the server
            assert not (await client.resume("A")).changed

    asyncio.run(scenario())


def test_malformed_or_misaddressed_replies_break_the_invariant() -> None:
    replies = {
        "status": {"name": "p", "checkpoint_id": "A", "state": "bogus", "ready": True},
        "resume": {"name": "p", "checkpoint_id": "OTHER", "state": "running", "changed": True},
        "abort": {"name": "q", "checkpoint_id": "A", "state": "running", "changed": True},
        "commit": {"name": "p", "checkpoint_id": "A", "artifacts": [{"path": "../x", "sha256": "0", "bytes": 1}]},
    }

    async def fake(request: web.Request) -> web.Response:
        return web.json_response(replies[request.match_info["route"]])

    async def scenario() -> None:
        app = web.Application()
        app.router.add_route("*", "/checkpoint/{route}", fake)
        async with serve(app) as (url, session):
            client = ParticipantClient("p", url, TOKEN, session)
            with pytest.raises(ParticipantInvariantBroken, match=r"participant p /checkpoint/status: malformed"):
                await client.status("A")
            with pytest.raises(ParticipantInvariantBroken, match="reply is about OTHER"):
                await client.resume("A")
            with pytest.raises(ParticipantInvariantBroken, match="from participant 'q'"):
                await client.abort("A")
            with pytest.raises(ParticipantInvariantBroken, match="not inside"):
                await client.commit("A", "/snap/p")

    asyncio.run(scenario())


def test_an_unreachable_participant_is_unavailable() -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            # Port 9 (discard) on loopback: nothing listens there.
            client = ParticipantClient("p", "http://127.0.0.1:9", TOKEN, session, timeout_s=2)
            with pytest.raises(ParticipantUnavailable, match="no reply"):
                await client.prepare("A", 5)

    asyncio.run(scenario())
