"""The rollout pump alone, with a scripted stand-in for the environment server."""

from __future__ import annotations

import asyncio

from controller.data_plane import DataPlane
from controller.dataloader import PromptDataloader
from controller.group_ledger import GroupLedger
from controller.rollout_pump import RolloutPump
from controller.run_stats import RunStats
from primitives.deadlines import DeadlineRegistry
from primitives.holds import HoldSet
from schemas.config import RolloutConfig, TaskConfig
from schemas.rollout import RolloutOutcome, RolloutRequest, RolloutResult, RolloutRow, Segment


class ScriptedEnv:
    """Answers /run per (sibling, attempt) with a delay and an outcome; records ACKs."""

    def __init__(self, script):
        self.script = script
        self.acked: list[str] = []
        self.cancelled: list[str] = []

    async def run(self, request: RolloutRequest) -> RolloutResult:
        delay, outcome = self.script(request.sibling, request.attempt)
        await asyncio.sleep(delay)
        if outcome is RolloutOutcome.FAILED:
            return RolloutResult(rollout_id=request.rollout_id, outcome=outcome, reason="tool crashed")
        row = RolloutRow(
            group_id=request.group_id,
            sibling=request.sibling,
            attempt=request.attempt,
            segments=[Segment(kind="policy", token_ids=[5, 6], logprobs=[-1.0, -1.0], policy_version=0)],
            reward=1.0,
            num_turns=1,
        )
        return RolloutResult(rollout_id=request.rollout_id, outcome=outcome, row=row, receipt=f"r-{request.rollout_id}")

    async def ack(self, receipt: str) -> None:
        self.acked.append(receipt)

    async def cancel(self, rollout_id: str) -> None:
        self.cancelled.append(rollout_id)

    async def cancel_all(self) -> int:
        return 0


def run_one_group(script, *, timeout_s: float, max_attempts: int, hold_for_s: float = 0.0):
    async def scenario():
        admission = HoldSet("admission")
        settled: list[tuple[str, bool]] = []
        env = ScriptedEnv(script)
        cfg = RolloutConfig(group_size=2, rollout_timeout_s=timeout_s, max_attempts=max_attempts)
        stats, plane, ledger = RunStats(), DataPlane(), GroupLedger()
        pump = RolloutPump(
            cfg, 1, PromptDataloader(TaskConfig(), seed=0), ledger, plane, env, admission,
            DeadlineRegistry(admission), stats, on_group_settled=lambda gid, ok: settled.append((gid, ok)),
        )
        task = asyncio.create_task(pump.run())
        if hold_for_s:
            await asyncio.sleep(0.05)
            admission.add("snapshot:test")  # parks the clocks of running rollouts
            await asyncio.sleep(hold_for_s)
            admission.release("snapshot:test")
        while not settled:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return settled, stats, plane, ledger, env

    return asyncio.run(scenario())


def test_failed_attempts_are_retried_with_a_new_attempt_number():
    script = lambda sibling, attempt: (0.0, RolloutOutcome.FAILED if attempt < 2 else RolloutOutcome.FINISHED)
    settled, stats, plane, _, env = run_one_group(script, timeout_s=5, max_attempts=3)
    assert settled == [("g0000000", True)]
    assert stats.retries == 4
    assert sorted(row.attempt for row in plane.rows("g0000000")) == [2, 2]
    assert sorted(env.acked) == ["r-g0000000.0.2", "r-g0000000.1.2"]


def test_timed_out_sibling_is_dropped_with_its_reason_after_max_attempts():
    script = lambda sibling, attempt: (10.0 if sibling == 1 else 0.0, RolloutOutcome.FINISHED)
    settled, stats, plane, _, env = run_one_group(script, timeout_s=0.2, max_attempts=2)
    assert settled == [("g0000000", False)]  # one sealed sibling is not a trainable group
    assert stats.siblings_dropped == {"timed_out": 1}
    assert env.cancelled == ["g0000000.1.0", "g0000000.1.1"]
    assert [row.sibling for row in plane.rows("g0000000")] == [0]


def test_a_parked_rollout_longer_than_its_budget_is_not_timed_out():
    script = lambda sibling, attempt: (0.3, RolloutOutcome.FINISHED)
    settled, stats, _, _, env = run_one_group(script, timeout_s=0.2, max_attempts=1, hold_for_s=0.0)
    assert settled == [("g0000000", False)]  # sanity: unheld, 0.3 s exceeds the 0.2 s budget

    # 0.3 s of work with a 0.25 s budget, but 0.2 s of it parked: only ~0.1 s counts.
    script = lambda sibling, attempt: (0.3, RolloutOutcome.FINISHED)
    settled, stats, _, _, env = run_one_group(script, timeout_s=0.25, max_attempts=1, hold_for_s=0.2)
    assert settled == [("g0000000", True)]
    assert stats.siblings_dropped == {}
    assert env.cancelled == []
