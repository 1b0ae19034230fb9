"""The policy server as a checkpoint participant, prepared after the environment server
(the coordinator's order), with real agents, real vLLM and real HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid

import aiohttp
import pytest

from tests.rollout_driver import RolloutDriver, wait_for, wait_ready
from turnkeep.participants.errors import ParticipantInvariantBroken, ParticipantUnavailable
from turnkeep.schemas.participant import FaultPlan, ParticipantState

pytestmark = pytest.mark.integration


def test_policy_fences_after_agents_park_and_commits_its_version(stack, stack_config, tmp_path) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            driver = RolloutDriver(session, stack.env_url, stack.control_token, stack_config.task)
            env = driver.client("env", stack.env_url)
            policy = driver.client("policy.0", stack.policy_url)
            ck = f"ck-{uuid.uuid4().hex[:8]}"
            try:
                assert (await policy.capabilities()).kind == "policy"
                agents = driver.start(8)
                await asyncio.sleep(0.05)
                # Environment first: its mid-turn agents need the policy to reach a boundary.
                await env.prepare(ck, lease_s=30)
                await wait_ready(env, ck)
                status = await policy.prepare(ck, lease_s=30)
                assert status.checkpoint_id == ck
                status = await wait_ready(policy, ck, timeout_s=10)
                assert status.running == 0

                # A call that arrives now waits at the closed gate.
                late_call = asyncio.create_task(complete(session, stack.policy_url))
                await wait_for(lambda: _waiting(policy, ck, 1), 5, "a completion call waiting at the gate")
                assert not late_call.done()

                await check_refusals(driver, policy, ck)
                await commit_with_faults(driver, policy, ck, tmp_path)

                # Resume in the coordinator's order: policy, then agents.
                assert (await policy.resume(ck)).changed
                assert (await asyncio.wait_for(late_call, 10))["choices"]
                assert (await env.resume(ck)).changed
                results = await asyncio.wait_for(asyncio.gather(*agents), 60)
                assert all(r.row is not None for r in results)
                assert not (await policy.abort(ck)).changed  # idempotent after the resume
                assert (await driver.health(stack.policy_url))["admission_open"]
            finally:
                await driver.cleanup([(policy, ck), (env, ck)])

    asyncio.run(scenario())


async def complete(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.post(f"{url}/v1/completions", json={"prompt": [1, 5, 6], "max_tokens": 2}) as resp:
        assert resp.status == 200
        return await resp.json()


async def _waiting(policy, ck: str, n: int) -> bool:
    return (await policy.status(ck)).waiting >= n


async def check_refusals(driver: RolloutDriver, policy, ck: str) -> None:
    async with driver.session.post(f"{policy.base_url}/checkpoint/resume", json={"checkpoint_id": ck}) as resp:
        body = await resp.json()
        assert resp.status == 401 and body["code"] == "unauthorized" and "control_token" in body["error"]
    with pytest.raises(ParticipantInvariantBroken) as info:
        await policy.commit("someone-else", "/tmp/snap/policy.0")
    assert info.value.code == "wrong_checkpoint"


async def commit_with_faults(driver: RolloutDriver, policy, ck: str, tmp_path) -> None:
    await policy.set_faults(FaultPlan(fail={"commit": 1}, enospc={"commit": 1}))
    try:
        with pytest.raises(ParticipantUnavailable, match="HTTP 500"):
            await policy.commit(ck, tmp_path / "policy.0")
        with pytest.raises(ParticipantUnavailable) as info:
            await policy.commit(ck, tmp_path / "policy.0")
        assert info.value.code == "io_error"
        result = await policy.commit(ck, tmp_path / "policy.0")
    finally:
        await policy.set_faults(FaultPlan())
    [artifact] = result.artifacts
    assert artifact.path == "policy.0/state.json"
    data = (tmp_path / artifact.path).read_bytes()
    assert artifact.sha256 == hashlib.sha256(data).hexdigest() and artifact.bytes == len(data)
    version = (await driver.health(policy.base_url))["policy_version"]
    assert json.loads(data) == {"policy_version": version, "weights_ok": True}
    assert (await policy.status(ck)).state is ParticipantState.COMMITTED
