"""Smoke test of the Ray actor: vLLM's spawned engine processes start inside it.

This starts a second engine (about 20 s), so it checks only what the in-process
tests cannot: that the actor starts, serves, reports health and stops.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from schemas.config import PolicyServerConfig

pytestmark = pytest.mark.integration


@pytest.fixture
def local_ray() -> Iterator[None]:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Short path: Ray's unix sockets live under it and have a ~107-byte limit.
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(_temp_dir=temp_dir, include_dashboard=False, num_cpus=2, log_to_driver=False)
    yield
    ray.shutdown()


async def _complete(url: str) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/completions", json={"prompt": [1, 5, 6], "max_tokens": 4}) as r:
            assert r.status == 200
            return await r.json()


def test_actor_starts_serves_and_stops(local_ray, tiny_model_dir: Path) -> None:
    import ray

    from gpu_workers.policy_actor import PolicyActor

    actor = PolicyActor.options(num_cpus=0).remote()
    cfg = PolicyServerConfig(kv_cache_memory_bytes=8 * 1024 * 1024, max_model_len=128, max_num_seqs=4)
    url = ray.get(actor.start.remote(str(tiny_model_dir), cfg.model_dump_json()), timeout=180)
    health = ray.get(actor.health.remote(), timeout=30)
    assert health["policy_version"] == 0 and health["admission_open"]
    assert asyncio.run(_complete(url))["policy_version"] == 0
    assert ray.get(actor.close_admission.remote("snapshot:x"), timeout=30)
    assert ray.get(actor.drain.remote(5.0), timeout=30) == 0
    assert ray.get(actor.open_admission.remote("snapshot:x"), timeout=30)
    ray.get(actor.stop.remote(), timeout=60)
