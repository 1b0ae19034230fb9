"""A stand-alone environment server attached by a new incarnation: what the dead controller left prepared is
aborted, so the restart attaches at whatever moment the kill landed; the same attachment is still refused while
it is prepared. The controller's `PUT /engines` list of policy engines needs the run's token and a valid body."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from tests.envs.test_codec import save_tiny_dir, tiny_tokenizer
from turnkeep.envs.environment import EnvContext
from turnkeep.envs.kinds import EnvironmentFactory
from turnkeep.envs.server import EnvServer
from turnkeep.envs.server_errors import AttachRefused
from turnkeep.participants.http_server import ControlAuth
from turnkeep.schemas.config import EnvironmentSpec
from turnkeep.schemas.config_services import EnvServerConfig
from turnkeep.schemas.environments import AttachRequest, RolloutLimits


def _request(model_dir: Path, incarnation: int, policy_urls: tuple[str, ...] = ()) -> AttachRequest:
    files = {p.name: p.read_text() for p in model_dir.iterdir() if p.is_file()}
    return AttachRequest(run_id="r", incarnation=incarnation, name="env", policy_url="http://127.0.0.1:9/",
                         policy_urls=list(policy_urls),
                         limits=RolloutLimits(max_turns=4, max_tokens_per_turn=8, max_model_len=64, temperature=1.0),
                         model_files=files, group_size=4)


def test_a_new_incarnation_attaches_over_the_checkpoint_its_dead_predecessor_left_prepared(tmp_path):
    model_dir = save_tiny_dir(tmp_path / "model", tiny_tokenizer())
    factory = EnvironmentFactory.from_specs({"calc": EnvironmentSpec()}, EnvContext(0.0, tmp_path / "ws"))
    server = EnvServer(factory, EnvServerConfig(port=0))

    async def scenario() -> None:
        await server.start()
        try:
            await server.attach(_request(model_dir, 1))
            server.participant.prepare("r.snapshot.4.1", lease_s=60)
            with pytest.raises(AttachRefused, match="prepared for checkpoint r.snapshot.4.1") as refused:
                await server.attach(_request(model_dir, 1))
            assert refused.value.status == 409
            reply = await server.attach(_request(model_dir, 2))
            assert reply.attachment == "r:2" and server.participant.current is None
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_put_engines_needs_the_token_and_an_engines_update(tmp_path):
    model_dir = save_tiny_dir(tmp_path / "model", tiny_tokenizer())
    factory = EnvironmentFactory.from_specs({"calc": EnvironmentSpec()}, EnvContext(0.0, tmp_path / "ws"))
    server = EnvServer(factory, EnvServerConfig(port=0), ControlAuth("secret"))
    token = {"Authorization": "Bearer secret"}
    engines = ["http://127.0.0.1:9", "http://127.0.0.1:10"]

    async def put(session: aiohttp.ClientSession, url: str, body, headers: dict = token) -> tuple[int, dict]:
        data = body if isinstance(body, str) else json.dumps(body)
        async with session.put(f"{url}/engines", data=data, headers=headers) as resp:
            return resp.status, await resp.json()

    async def scenario() -> None:
        url = await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                assert (await put(session, url, {"urls": engines}, headers={}))[0] == 401
                assert (await put(session, url, {"urls": engines}, headers={"Authorization": "Bearer nope"}))[0] == 401
                status, reply = await put(session, url, {"urls": engines})
                assert status == 503 and "no run is attached" in reply["error"]
                await server.attach(_request(model_dir, 1, policy_urls=tuple(engines)))
                assert server.health()["policy_engines"]["routable"] == 2
                for bad in ({"urls": []}, {"urls": ["ftp://x"]}, {"url": engines}, "not json"):
                    status, reply = await put(session, url, bad)
                    assert status == 400 and "not an EnginesUpdate" in reply["error"], (bad, reply)
                assert await put(session, url, {"urls": engines[:1]}) == (200, {"engines": 1})
                assert server.health()["policy_engines"]["routable"] == 1
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_an_attach_without_policy_urls_routes_to_its_policy_url(tmp_path):
    model_dir = save_tiny_dir(tmp_path / "model", tiny_tokenizer())
    factory = EnvironmentFactory.from_specs({"calc": EnvironmentSpec()}, EnvContext(0.0, tmp_path / "ws"))
    server = EnvServer(factory, EnvServerConfig(port=0))

    async def scenario() -> None:
        await server.start()
        try:
            assert server.health()["policy_engines"] is None
            await server.attach(_request(model_dir, 1))
            assert list(server._policy.stats()["engines"]) == ["http://127.0.0.1:9"]
        finally:
            await server.stop()

    asyncio.run(scenario())
