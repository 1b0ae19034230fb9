"""A stand-alone environment server attached by a new incarnation: what the dead controller left prepared is
aborted, so the restart attaches at whatever moment the kill landed; the same attachment is still refused while
it is prepared."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from envs.environment import EnvContext
from envs.kinds import EnvironmentFactory
from envs.server import EnvServer
from envs.server_routes import AttachRefused
from schemas.config import EnvironmentSpec
from schemas.config_services import EnvServerConfig
from schemas.environments import AttachRequest, RolloutLimits
from tests.envs.test_codec import save_tiny_dir, tiny_tokenizer


def _request(model_dir: Path, incarnation: int) -> AttachRequest:
    files = {p.name: p.read_text() for p in model_dir.iterdir() if p.is_file()}
    return AttachRequest(run_id="r", incarnation=incarnation, name="env", policy_url="http://127.0.0.1:9/",
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
