"""The environment server as a checkpoint participant, over HTTP, with real agents and vLLM."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import aiohttp
import orjson
import pytest

from tests.rollout_driver import RolloutDriver, wait_for, wait_ready
from turnkeep.participants.errors import ParticipantInvariantBroken, ParticipantRefused
from turnkeep.schemas.participant import ParticipantState, SavedAgent

pytestmark = pytest.mark.integration


def checkpoint_id() -> str:
    return f"ck-{uuid.uuid4().hex[:8]}"


SLOW_TOOL_S = 0.5
"""Every tool call this much longer: the agents are mid-rollout when the checkpoint comes, not already done."""


async def start_agents(driver: RolloutDriver, n: int) -> list[asyncio.Task]:
    await driver.slow_tools(SLOW_TOOL_S)
    tasks = driver.start(n)
    await wait_for(lambda: _running_at_least(driver, n), 10, f"{n} agents running")
    return tasks


async def _running_at_least(driver: RolloutDriver, n: int) -> bool:
    finished = sum(t.done() for t in driver.tasks)
    return (await driver.unfenced_status(driver.env_url)).running + finished >= n


def test_agents_park_at_boundaries_are_saved_and_continue(stack, stack_config, tmp_path) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            driver = RolloutDriver(session, stack.env_url, stack.control_token, stack_config.task)
            env = driver.client("env", stack.env_url)
            ck = checkpoint_id()
            try:
                calc = {caps.name: caps for caps in (await env.capabilities()).environments}["calc"]
                assert (calc.recovery_mode, calc.group_scored) == ("stateless", False)
                early = await start_agents(driver, 12)
                status = await env.prepare(ck, lease_s=30)
                assert status.checkpoint_id == ck
                assert status.state in (ParticipantState.PREPARING, ParticipantState.PREPARED)
                late = driver.start(2)  # arrive while prepared: they wait at the door, not started
                status = await wait_ready(env, ck)
                await wait_for(lambda: _waiting(driver, 2), 5, "two requests waiting at the door")
                assert status.running == 0 and status.unacked == 0 and status.parked >= 1
                assert not any(t.done() for t in late)

                await check_refusals(driver, env, ck)

                result = await env.commit(ck, tmp_path / "env")
                saved = check_artifacts(result, tmp_path, status.parked)
                assert (await env.status(ck)).state is ParticipantState.COMMITTED

                reply = await env.resume(ck)
                assert reply.changed and reply.state is ParticipantState.RUNNING
                assert not (await env.resume(ck)).changed
                results = await asyncio.wait_for(asyncio.gather(*early, *late), 60)
                check_continued(results, saved)
                health = await driver.health()
                assert health["running"] == 0 and health["unacked"] == 0 and health["boundary_holders"] == []
            finally:
                await driver.cleanup([(env, ck)])

    asyncio.run(scenario())


async def _parked_at_least(env, ck: str, n: int) -> bool:
    return (await env.status(ck)).parked >= n


async def _parked_or_all_done(env, ck: str, tasks: list[asyncio.Task]) -> bool:
    return all(t.done() for t in tasks) or await _parked_at_least(env, ck, 1)


async def _waiting(driver: RolloutDriver, n: int) -> bool:
    return (await driver.unfenced_status(driver.env_url)).waiting == n


async def check_refusals(driver: RolloutDriver, env, ck: str) -> None:
    async with driver.session.get(f"{driver.env_url}/checkpoint/status", params={"checkpoint_id": ck}) as resp:
        body = await resp.json()
        assert resp.status == 401 and body["code"] == "unauthorized" and "control_token" in body["error"]
    with pytest.raises(ParticipantInvariantBroken) as info:
        await env.status("someone-else")
    assert info.value.code == "wrong_checkpoint"
    with pytest.raises(ParticipantInvariantBroken):
        await env.prepare("someone-else", lease_s=30)


def check_artifacts(result, root, parked: int) -> list[SavedAgent]:
    [artifact] = result.artifacts
    assert artifact.path == "env/agents.jsonl"
    data = (root / artifact.path).read_bytes()
    assert artifact.sha256 == hashlib.sha256(data).hexdigest() and artifact.bytes == len(data)
    assert result.counts == {"parked_agents": parked}
    saved = [SavedAgent.model_validate(orjson.loads(line)) for line in data.splitlines()]
    assert len(saved) == parked
    for agent in saved:
        assert agent.boundary.turn_index >= 1
        assert agent.boundary.segments[-1].kind == "tool"  # parked after a finished tool call
        if agent.env_state is not None:  # an exported environment's own state, at the same boundary
            assert len(agent.env_state["turns"]) == agent.boundary.turn_index
    return saved


def check_continued(results, saved: list[SavedAgent]) -> None:
    by_id = {r.rollout_id: r for r in results}
    assert all(r.row is not None for r in results), [r.reason for r in results if r.row is None]
    for agent in saved:
        # The live agent went on from exactly the boundary that was saved.
        row = by_id[agent.request.rollout_id].row
        kept = agent.boundary.segments
        assert row.segments[: len(kept)] == kept and row.num_turns > agent.boundary.turn_index


def test_an_unrenewed_lease_lets_the_agents_go_by_themselves(stack, stack_config) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            driver = RolloutDriver(session, stack.env_url, stack.control_token, stack_config.task)
            env = driver.client("env", stack.env_url)
            ck = checkpoint_id()
            try:
                tasks = await start_agents(driver, 12)
                # A lease longer than any wait for a park (however long that takes on a loaded machine), then a last
                # short renewal: the agents are held when the lease runs out, at every moment.
                await env.prepare(ck, lease_s=600.0)
                await wait_for(lambda: _parked_or_all_done(env, ck, tasks), 300, "an agent parked or every agent done")
                assert (await env.status(ck)).parked >= 1, "every agent ended its episode before the prepare"
                await env.renew(ck, lease_s=1.0)
                # Nobody renews again: the server resumes by itself and every agent finishes.
                results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
                assert all(r.row is not None for r in results)
                health = await driver.health()
                assert health["checkpoint_id"] is None and health["door_holders"] == []
                with pytest.raises(ParticipantRefused) as info:
                    await env.status(ck)
                assert info.value.code == "released" and "lease expired" in str(info.value), info.value
                assert not (await env.abort(ck)).changed  # the late compensation is a no-op
            finally:
                await driver.cleanup([(env, ck)])

    asyncio.run(scenario())


def test_commit_faults_are_retryable(stack, stack_config, tmp_path) -> None:
    from turnkeep.participants.errors import ParticipantUnavailable
    from turnkeep.schemas.participant import FaultPlan

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            driver = RolloutDriver(session, stack.env_url, stack.control_token, stack_config.task)
            env = driver.client("env", stack.env_url)
            ck = checkpoint_id()
            try:
                await env.prepare(ck, lease_s=30)
                await wait_ready(env, ck)
                await env.set_faults(FaultPlan(fail={"commit": 1}, enospc={"commit": 1}))
                with pytest.raises(ParticipantUnavailable, match="HTTP 500"):
                    await env.commit(ck, tmp_path / "env")
                with pytest.raises(ParticipantUnavailable, match="No space left") as info:
                    await env.commit(ck, tmp_path / "env")
                assert info.value.code == "io_error"
                result = await env.commit(ck, tmp_path / "env")
                assert result.counts == {"parked_agents": 0}
                assert (await env.abort(ck)).changed
            finally:
                await env.set_faults(FaultPlan())
                await driver.cleanup([(env, ck)])

    asyncio.run(scenario())
