"""The policy server inside its Ray actor, as the run places it (the session's shared stack)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

pytestmark = pytest.mark.integration


async def _complete(url: str) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/completions", json={"prompt": [1, 5, 6], "max_tokens": 4}) as r:
            assert r.status == 200
            return await r.json()


def test_actor_serves_and_its_gate_closes_and_drains(stack) -> None:
    import ray

    policy = stack.policy
    version = ray.get(policy.health.remote(), timeout=30)["policy_version"]
    assert asyncio.run(_complete(stack.policy_url))["policy_version"] == version
    assert ray.get(policy.close_admission.remote("snapshot:x"), timeout=30)
    health = ray.get(policy.health.remote(), timeout=30)
    assert not health["admission_open"] and health["holders"] == ["snapshot:x"]
    ray.get(policy.drain.remote(5.0), timeout=30)  # calls left over from earlier tests may drain here
    assert ray.get(policy.health.remote(), timeout=30)["inflight"] == 0
    assert ray.get(policy.open_admission.remote("snapshot:x"), timeout=30)
    assert ray.get(policy.health.remote(), timeout=30)["admission_open"]


def test_the_engine_core_is_forked_from_the_preloaded_forkserver_not_spawned(stack) -> None:
    import os

    import psutil
    import ray

    actor_pid = ray.get(stack.policy.__ray_call__.remote(lambda actor: os.getpid()), timeout=30)
    children = psutil.Process(actor_pid).children()
    [forkserver] = [p for p in children if "multiprocessing.forkserver" in " ".join(p.cmdline())]
    assert "vllm.v1.engine.core" in " ".join(forkserver.cmdline())  # it imported vLLM beside the actor
    assert forkserver.children(), "the engine core is the forkserver's child"
    assert not [p for p in children if "multiprocessing.spawn" in " ".join(p.cmdline())]
