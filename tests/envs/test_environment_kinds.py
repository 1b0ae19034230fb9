"""Every built-in environment kind on the real environment server, vLLM and HTTP: what it
reports, how a snapshot saves its parked agents, and how each comes back as its recovery
mode says (replayed, restored from its exported files, or started over)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import aiohttp
import pytest

from tests.envs.test_env_participant import _running_at_least, check_artifacts
from tests.envs.test_restore_route import continuation
from tests.rollout_driver import RolloutDriver, wait_for, wait_ready
from turnkeep.envs.calc_task import score
from turnkeep.envs.codec import TurnCodec
from turnkeep.schemas.environments import JudgeReply, JudgeRequest
from turnkeep.schemas.rollout import RolloutOutcome

pytestmark = pytest.mark.integration
KINDS = ("calc", "workspace", "lab", "judge")


def test_each_kind_reports_its_mode_and_comes_back_as_the_mode_says(stack, stack_config, tmp_path) -> None:
    codec = TurnCodec(stack.model_dir)

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            driver = RolloutDriver(session, stack.env_url, stack.control_token, stack_config.task)
            env = driver.client("env", stack.env_url)
            releases: list = []
            try:
                reported = {caps.name: caps for caps in (await env.capabilities()).environments}
                assert {n: (c.recovery_mode, c.group_scored, c.group_size) for n, c in reported.items()} == {
                    "calc": ("stateless", False, None), "workspace": ("exported", False, None),
                    "lab": ("restart_only", False, None), "judge": ("stateless", True, stack_config.rollout.group_size),
                }
                saved, finished, ck, root = await _park_every_kind(
                    driver, env, stack_config.rollout.group_size, tmp_path, releases)
                for agent in saved:
                    kind = agent.request.problem.env
                    if kind == "workspace":  # the tape of every result so far, exported with the turns
                        assert len(agent.env_state["files"]["tape"].splitlines()) <= agent.boundary.turn_index
                    else:
                        assert agent.env_state is None

                reply = await env.restore(f"recovery-{ck}", root / "env")
                lab = sorted(a.request.rollout_id for a in saved if a.request.problem.env == "lab")
                assert reply.cannot_continue == lab
                assert sorted(reply.restored) == sorted(a.request.rollout_id for a in saved
                                                        if a.request.problem.env != "lab")
                results = await asyncio.wait_for(
                    asyncio.gather(*(driver.run_and_ack(continuation(a)) for a in saved)), 90)
                for agent, result in zip(saved, results, strict=True):
                    if agent.request.problem.env == "lab":
                        assert result.outcome is RolloutOutcome.FAILED and "no restored agent" in result.reason
                        continue
                    # Replayed (calc, judge) or restored from its files (workspace): the same turns, token for token.
                    assert result.row is not None, result.reason
                    assert result.row.segments[: len(agent.boundary.segments)] == agent.boundary.segments
                    if agent.request.problem.env == "workspace":
                        turns = [codec.decode(s.token_ids) for s in result.row.segments if s.kind == "policy"]
                        # The reward reads the restored tape: it agrees with the turns only if the files came back.
                        assert result.row.reward == score(agent.request.problem, turns)

                judged = finished["judge"]
                assert all(r.row is not None for r in judged), [r.reason for r in judged]
                request = JudgeRequest(
                    group_id=judged[0].row.group_id, problem=saved[0].request.problem.model_copy(
                        update={"env": "judge", "question": "Q 1+2", "answer": 3}),
                    policy_turns=[[s.token_ids for s in r.row.segments if s.kind == "policy"] for r in judged],
                )
                async with session.post(f"{stack.env_url}/judge", data=request.model_dump_json(),
                                        headers={"Authorization": f"Bearer {stack.control_token}"}) as resp:
                    assert resp.status == 200, await resp.text()
                    rewards = JudgeReply.model_validate_json(await resp.read()).rewards
                # Pairwise, half a win per tie: the rewards of a group always add up to N/2.
                assert len(rewards) == len(judged) and sum(rewards) == pytest.approx(len(judged) / 2)
                request = request.model_copy(update={"problem": request.problem.model_copy(update={"env": "calc"})})
                async with session.post(f"{stack.env_url}/judge", data=request.model_dump_json(),
                                        headers={"Authorization": f"Bearer {stack.control_token}"}) as resp:
                    assert resp.status == 400 and "not group-scored" in await resp.text()
            finally:
                await driver.cleanup(releases)

    asyncio.run(scenario())


async def _park_every_kind(driver, env, size: int, tmp_path, releases: list, tries: int = 4):
    """One group of every kind running, then a checkpoint that parks them: again with fresh groups while
    some kind had no agent at a boundary (a sampled episode can end in one turn, before the prepare)."""
    by_kind: Counter = Counter()
    for attempt in range(tries):
        ck = f"ck-{uuid.uuid4().hex[:8]}"
        releases.append((env, ck))
        originals = {kind: driver.start(size, env=kind) for kind in KINDS}
        await wait_for(lambda: _running_at_least(driver, size * len(KINDS)), 10, "every agent running")
        await env.prepare(ck, lease_s=30)
        status = await wait_ready(env, ck)
        root = tmp_path / f"try{attempt}"
        saved = check_artifacts(await env.commit(ck, root / "env"), root, status.parked)
        await env.resume(ck)
        finished = {kind: await asyncio.wait_for(asyncio.gather(*tasks), 90) for kind, tasks in originals.items()}
        by_kind = Counter(agent.request.problem.env for agent in saved)
        if set(by_kind) == set(KINDS):
            return saved, finished, ck, root
        driver.tasks.clear()  # this try's agents are all done: the next try counts only its own
    raise AssertionError(f"no checkpoint in {tries} tries parked an agent of every kind; the last: {by_kind}")
