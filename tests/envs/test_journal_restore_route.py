"""A restore from the turn journal: the environment server rebuilds each wanted rollout's newest boundary of the
restored policy from its own journal, and a continuation goes on from exactly there (or, at a boundary where the
episode ended, only scores it)."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import pytest

from tests.rollout_driver import RolloutDriver
from tests.stack_training import in_new_run_dir, train_shared_stack
from turnkeep.schemas.participant import RunningAgent
from turnkeep.schemas.rollout import RolloutOutcome, RolloutRequest

pytestmark = pytest.mark.integration


def continuation(request: RolloutRequest) -> RolloutRequest:
    return request.model_copy(update={
        "rollout_id": f"{request.group_id}.{request.sibling}.{request.attempt + 1}", "attempt": request.attempt + 1,
        "resume_from": request.rollout_id,
    })


def test_finished_rollouts_come_back_from_the_journal_and_only_score(stack, stack_config) -> None:
    async def scenario() -> None:
        start = await stack.trainer.version.remote()
        if start == 0:
            # Turns of a policy newer than the first, so that a restored trainer older than every turn exists.
            await train_shared_stack(in_new_run_dir(stack_config, "tk-journal-"), stack, start, steps=1)
        async with aiohttp.ClientSession() as session:
            driver = RolloutDriver(session, stack.env_url, stack.control_token, stack_config.task)
            env = driver.client("env", stack.env_url)
            tasks = driver.start(6)
            originals = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            requests = {r.rollout_id: driver.requests[r.rollout_id] for r in originals}
            version = (await driver.health(stack.policy_url))["policy_version"]

            # A restored trainer older than every turn: no boundary of these rollouts may be continued.
            older = await env.restore_from_journal(f"recovery-{uuid.uuid4().hex[:6]}",
                                                   {rid: RunningAgent(max_version=version - 1, incarnation=0)
                                                    for rid in requests})
            assert older.restored == [] and older.held == []

            # Another incarnation's attempts under the same ids: another lineage, nothing continues.
            foreign = await env.restore_from_journal(f"recovery-{uuid.uuid4().hex[:6]}",
                                                     {rid: RunningAgent(max_version=version, incarnation=7)
                                                      for rid in requests})
            assert foreign.restored == [] and foreign.held == []

            reply = await env.restore_from_journal(f"recovery-{uuid.uuid4().hex[:6]}",
                                                   {rid: RunningAgent(max_version=version, incarnation=0)
                                                    for rid in requests})
            finished = {r.rollout_id: r for r in originals if r.outcome is RolloutOutcome.FINISHED}
            assert finished, "no rollout finished; the test needs at least one"
            held = {h.rollout_id: h for h in reply.held}
            assert set(finished) <= set(held)
            for rid, result in finished.items():
                assert held[rid].done and held[rid].segments == len(result.row.segments)
                again = await driver.run_and_ack(continuation(requests[rid]))
                # The episode had ended at the journaled boundary: the same row, scored again, nothing generated.
                assert again.outcome is RolloutOutcome.FINISHED, again.reason
                assert again.row.segments == result.row.segments and again.row.reward == result.row.reward

    asyncio.run(scenario())
