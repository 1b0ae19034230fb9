"""The policy server's first request runs after `start` returns: a weight load waits for it, and a failed one is
named by every call that needs the engine instead of being lost."""

from __future__ import annotations

import asyncio

import pytest

from turnkeep.gpu_workers import policy_server as server_module
from turnkeep.gpu_workers.policy_errors import WeightsUnavailable
from turnkeep.gpu_workers.policy_server import PolicyServer
from turnkeep.schemas.config_services import PolicyServerConfig
from turnkeep.schemas.policy import CompletionRequest


class _Engine:
    class model_config:  # noqa: N801 - AsyncLLM's attribute name
        @staticmethod
        def get_vocab_size() -> int:
            return 30

    def shutdown(self) -> None:
        pass


def _serve(monkeypatch, first_request) -> PolicyServer:
    monkeypatch.setattr(server_module, "build_engine", lambda *args, **kwargs: _Engine())
    monkeypatch.setattr(server_module, "generate", first_request)
    monkeypatch.setattr(server_module, "refit_engine", _refit)
    monkeypatch.setattr(server_module, "check_blob", lambda blob, shapes: None)
    return PolicyServer()


refits: list[str] = []


async def _refit(engine, blob: bytes) -> None:
    refits.append("refit")


def test_a_weight_load_sent_at_once_waits_for_the_first_request(monkeypatch, tmp_path) -> None:
    order: list[str] = []

    async def first_request(*args) -> None:
        await asyncio.sleep(0.2)
        order.append("first request")

    async def scenario() -> None:
        server = _serve(monkeypatch, first_request)
        await server.start(tmp_path, PolicyServerConfig(port=0))
        refits.clear()
        await server.load_weights(b"", 1)
        order.extend(refits)
        assert server.policy_version == 1 and server.weights_ok
        await server.stop()

    asyncio.run(scenario())
    assert order == ["first request", "refit"]


def test_a_failed_first_request_is_named_by_calls_weight_loads_and_health(monkeypatch, tmp_path) -> None:
    async def first_request(*args) -> None:
        raise RuntimeError("engine core died")

    async def scenario() -> None:
        server = _serve(monkeypatch, first_request)
        await server.start(tmp_path, PolicyServerConfig(port=0))
        await asyncio.sleep(0.05)
        health = server.health()
        assert not health["weights_ok"]
        assert health["warm_up_error"] == "the engine's first request failed: RuntimeError: engine core died"
        with pytest.raises(WeightsUnavailable, match="first request failed: RuntimeError: engine core died"):
            await server.complete(CompletionRequest(prompt=[1, 2], max_tokens=2))
        with pytest.raises(RuntimeError, match="cannot load weights: the engine's first request failed"):
            await server.load_weights(b"", 1)
        await server.stop()

    asyncio.run(scenario())
