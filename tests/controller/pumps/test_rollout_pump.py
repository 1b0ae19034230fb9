"""The rollout pump alone, with a scripted stand-in for the environment server."""

from __future__ import annotations

import asyncio

import pytest

from turnkeep.controller.pumps.env_client import EnvServerError
from turnkeep.controller.pumps.rollout_pump import RolloutPump
from turnkeep.controller.rollout_levels import RolloutLevelPlan
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.dataloader import PromptDataloader
from turnkeep.controller.state.group_ledger import GroupLedger
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.envs.calc_task import CalcProblems
from turnkeep.primitives.deadlines import DeadlineRegistry
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.config import RolloutConfig, TaskConfig
from turnkeep.schemas.environments import FINEST_LEVEL, coarser
from turnkeep.schemas.rollout import RolloutOutcome, RolloutRequest, RolloutResult, RolloutRow, Segment


class ScriptedEnv:
    """Answers /run per (sibling, attempt) with a delay and an outcome; records ACKs."""

    def __init__(self, script):
        self.script = script
        self.acked: list[str] = []
        self.cancelled: list[str] = []
        self.judged: list[str] = []
        self.requests: list[RolloutRequest] = []

    async def run(self, request: RolloutRequest) -> RolloutResult:
        self.requests.append(request)
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

    async def judge(self, request) -> list[float]:
        self.judged.append(request.group_id)
        # A stand-in judge: the sibling with the most policy tokens wins every comparison.
        lengths = [sum(len(turn) for turn in sibling) for sibling in request.policy_turns]
        return [float(n == max(lengths)) for n in lengths]

    async def cancel(self, rollout_id: str) -> None:
        self.cancelled.append(rollout_id)

    async def wait_available(self, env_name: str) -> None:
        pass

    def is_away(self, env_name: str) -> bool:
        return False

    async def cancel_all(self) -> int:
        return 0


CALC = RolloutLevelPlan("calc", "calc", "stateless", "turn")


def run_one_group(script, *, timeout_s: float, max_attempts: int, hold_for_s: float = 0.0,
                  plan: RolloutLevelPlan = CALC, group_size: int = 2, env_class=None):
    async def scenario():
        admission = HoldSet("admission")
        settled: list[tuple[str, bool]] = []
        env = (env_class or ScriptedEnv)(script)
        cfg = RolloutConfig(group_size=group_size, rollout_timeout_s=timeout_s, max_attempts=max_attempts)
        stats, plane, ledger = RunStats(), DataPlane(), GroupLedger()
        pump = RolloutPump(
            cfg, 1, PromptDataloader(CalcProblems(TaskConfig(), 0), seed=0), ledger, plane, env, admission,
            DeadlineRegistry(admission), stats, on_group_settled=lambda gid, ok: settled.append((gid, ok)),
            plans={"calc": plan},
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


class AwayServerEnv(ScriptedEnv):
    """Sibling 0's first three attempts fail because the server went away under them; the pump must wait for it
    (`wait_available`) before each new attempt."""

    def __init__(self, script):
        super().__init__(script)
        self.away = False
        self.waits = 0

    async def run(self, request: RolloutRequest) -> RolloutResult:
        if request.sibling == 0 and request.attempt < 3:
            self.requests.append(request)
            self.away = True
            return RolloutResult(rollout_id=request.rollout_id, outcome=RolloutOutcome.FAILED,
                                 reason="ClientConnectorError: connection refused")
        return await super().run(request)

    async def wait_available(self, env_name: str) -> None:
        if self.away:
            self.waits += 1
            await asyncio.sleep(0.05)
            self.away = False

    def is_away(self, env_name: str) -> bool:
        return self.away


def test_attempts_cut_off_by_an_absent_server_wait_for_it_and_spend_no_attempt():
    script = lambda sibling, attempt: (0.0, RolloutOutcome.FINISHED)
    settled, stats, plane, ledger, env = run_one_group(script, timeout_s=5, max_attempts=1, env_class=AwayServerEnv)
    # With one attempt allowed, counting these as failures would have dropped sibling 0 and the group with it.
    assert settled == [("g0000000", True)]
    assert (stats.retries, stats.interrupted, dict(stats.siblings_dropped)) == (0, 3, {})
    assert env.waits == 3
    assert sorted(row.attempt for row in plane.rows("g0000000")) == [0, 3]


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


# ---- recovery levels: a live failure of one sibling, per environment kind and level ----

JUDGE = RolloutLevelPlan("calc", "judge", "stateless", "turn", group_scored=True)


def _fail_sibling_2_once(sibling, attempt):
    # Siblings 0 and 1 seal at once; sibling 2 fails a little later, on its first attempt only.
    if sibling == 2 and attempt == 0:
        return 0.05, RolloutOutcome.FAILED
    return 0.0, RolloutOutcome.FINISHED


KINDS = {"calc": ("stateless", False), "workspace": ("exported", False), "lab": ("restart_only", False),
         "judge": ("stateless", True)}
EVERY_KIND_AND_LEVEL = [(kind, level) for kind in KINDS for level in ("turn", "sibling", "prompt_group")]


def plan_for(kind: str, target: str) -> RolloutLevelPlan:
    """The plan `plan_levels` gives this kind at this target (a restart_only kind is lowered to sibling)."""
    mode, group_scored = KINDS[kind]
    return RolloutLevelPlan("calc", kind, mode, coarser(target, FINEST_LEVEL[mode]), group_scored)


@pytest.mark.parametrize("kind, level", EVERY_KIND_AND_LEVEL)
def test_a_live_failure_of_one_sibling_per_environment_kind_and_level(kind, level):
    plan = plan_for(kind, level)
    settled, stats, plane, _, env = run_one_group(_fail_sibling_2_once, timeout_s=5, max_attempts=3, plan=plan,
                                                  group_size=3)
    assert settled == [("g0000000", True)]
    counts = dict(stats.recovery_by_env["calc"])
    if plan.group_scored or level == "prompt_group":
        # The whole group reruns: the two sealed round-0 rows are discarded.
        assert [row.attempt for row in plane.rows("g0000000")] == [1, 1, 1]
        counter = "groups_retried_whole" if plan.group_scored else "groups_rerun_whole"
        assert counts == {counter: 1, "sealed_discarded": 2, "rerun_from_scratch": 3}
        assert stats.retries == 0
    else:
        # Only the failed sibling reruns; the sealed ones are kept.
        assert [row.attempt for row in plane.rows("g0000000")] == [0, 0, 1]
        assert counts == {"rerun_from_scratch": 1} and stats.retries == 1
    assert env.judged == (["g0000000"] if plan.group_scored else [])  # judged once, in the final round
    assert not stats.siblings_dropped


def test_a_group_scored_group_that_keeps_failing_is_dropped_after_max_attempts_rounds():
    always_fails = lambda sibling, attempt: (0.01, RolloutOutcome.FAILED if sibling == 1 else RolloutOutcome.FINISHED)
    settled, stats, plane, _, env = run_one_group(always_fails, timeout_s=5, max_attempts=2, plan=JUDGE,
                                                  group_size=2)
    assert settled == [("g0000000", False)]
    assert plane.rows("g0000000") == [] and env.judged == []
    assert stats.recovery_by_env["calc"]["groups_retried_whole"] == 1


# ---- recovery levels: a restore, per environment kind and level ----


def restore_one_group(plan: RolloutLevelPlan):
    """A restored group of 3: sibling 0 sealed, sibling 1 saved at turn 2 (a continuation), sibling 2 running."""
    from turnkeep.controller.pumps.rollout_pump import Continuation
    from turnkeep.schemas.rollout import Problem

    async def scenario():
        admission = HoldSet("admission")
        settled: list[tuple[str, bool]] = []
        env = ScriptedEnv(lambda sibling, attempt: (0.0, RolloutOutcome.FINISHED))
        cfg = RolloutConfig(group_size=3, rollout_timeout_s=5, max_attempts=3)
        stats, plane, ledger = RunStats(), DataPlane(), GroupLedger()
        ledger.admit("g1", Problem(question="Q 1+2", answer=3), 3)
        for sibling in range(3):
            ledger.start_attempt("g1", sibling)
        ledger.seal("g1", 0)
        plane.put(RolloutRow(group_id="g1", sibling=0, attempt=0, reward=1.0, num_turns=1,
                             segments=[Segment(kind="policy", token_ids=[5], logprobs=[-1.0], policy_version=0)]))
        pump = RolloutPump(
            cfg, 1, PromptDataloader(CalcProblems(TaskConfig(), 0), seed=0), ledger, plane, env, admission,
            DeadlineRegistry(admission), stats, on_group_settled=lambda gid, ok: settled.append((gid, ok)),
            plans={"calc": plan},
        )
        saved = Continuation(rollout_id="g1.1.0", turn_index=2, segments=5, boundary_sha="sha")
        queued, _ = pump.restore({("g1", 1): saved})  # the in-flight limit of 1 keeps new groups out
        task = asyncio.create_task(pump.run())
        while not settled:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        started = {r.sibling: r.resume_from for r in env.requests if r.group_id == "g1"}
        return queued, settled, started, [row.attempt for row in plane.rows("g1")], stats, env

    return asyncio.run(scenario())


@pytest.mark.parametrize("kind, level", EVERY_KIND_AND_LEVEL)
def test_a_restore_per_environment_kind_and_level(kind, level):
    plan = plan_for(kind, level)
    queued, settled, started, attempts, stats, env = restore_one_group(plan)
    assert settled == [("g1", True)]
    counts = dict(stats.recovery_by_env["calc"])
    if level == "prompt_group":
        # The whole group reruns: the sealed sibling is discarded and the saved turns are not used.
        assert queued == 3 and started == {0: None, 1: None, 2: None} and attempts == [1, 1, 1]
        assert counts == {"groups_rerun_whole": 1, "sealed_discarded": 1, "rerun_from_scratch": 3}
    else:
        resumed = plan.level == "turn"  # never for restart_only: its level was lowered to sibling
        assert queued == 2 and attempts == [0, 1, 1]  # sibling 0 stays sealed
        assert started == {1: "g1.1.0" if resumed else None, 2: None}
        assert counts == ({"resumed_from_turn": 1, "rerun_from_scratch": 1} if resumed
                          else {"rerun_from_scratch": 2})
    assert env.judged == (["g1"] if plan.group_scored else [])


def test_two_siblings_failing_in_the_same_round_rerun_the_group_once():
    # Siblings 1 and 2 both fail on their first attempt, at the same moment.
    script = lambda sibling, attempt: (0.02, RolloutOutcome.FAILED if sibling and attempt == 0
                                       else RolloutOutcome.FINISHED)
    settled, stats, plane, _, _ = run_one_group(script, timeout_s=5, max_attempts=3, plan=JUDGE, group_size=3)
    assert settled == [("g0000000", True)]
    assert stats.recovery_by_env["calc"]["groups_retried_whole"] == 1
    assert [row.attempt for row in plane.rows("g0000000")] == [1, 1, 1]


def test_the_ack_goes_out_after_the_barrier_opens_and_a_flush_waits_for_it():
    """A hung ACK must not hold the data-plane barrier (every cut and trainer step waits on it),
    yet a flush that passes the barrier must still see the ACK as pending."""
    release_ack = asyncio.Event()
    seen: dict[str, object] = {}

    async def scenario():
        plane = DataPlane()
        env = ScriptedEnv(lambda sibling, attempt: (0.0, RolloutOutcome.FINISHED))

        async def slow_ack(receipt: str) -> None:
            seen["barrier_held_during_ack"] = plane.barrier.locked()
            seen["pending_during_ack"] = plane.pending_acks.receipts()
            await release_ack.wait()
            env.acked.append(receipt)

        env.ack = slow_ack
        ledger = GroupLedger()
        pump = RolloutPump(
            RolloutConfig(group_size=2, rollout_timeout_s=5, max_attempts=1), 1, PromptDataloader(CalcProblems(TaskConfig(), 0), seed=0),
            ledger, plane, env, HoldSet("admission"), DeadlineRegistry(HoldSet("deadlines")), RunStats(),
            on_group_settled=lambda gid, ok: None, plans={"calc": CALC},
        )
        task = asyncio.create_task(pump.run())
        while "pending_during_ack" not in seen:
            await asyncio.sleep(0.01)
        # The ACK hangs, and the barrier is free: a cut or a train step takes it at once.
        await asyncio.wait_for(plane.barrier.acquire(), timeout=0.5)
        plane.barrier.release()
        assert await plane.pending_acks.drained(0.1) == seen["pending_during_ack"]
        release_ack.set()
        left = await plane.pending_acks.drained(2.0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return left, env.acked, plane.num_rows()

    left, acked, rows = asyncio.run(scenario())
    assert seen["barrier_held_during_ack"] is False
    assert seen["pending_during_ack"] and set(seen["pending_during_ack"]) <= set(acked)
    assert left == [] and rows >= 1


@pytest.mark.timeout(30)
def test_an_ack_that_never_gets_through_keeps_the_row_and_settles_the_group(monkeypatch, caplog):
    """A server that died after returning its results cannot take their ACKs: the rows are stored, so the
    group settles and training goes on (before, the sibling task crashed and the pump with it)."""
    monkeypatch.setattr(asyncio, "sleep", _no_backoff(asyncio.sleep))

    class DeadOnAck(ScriptedEnv):
        async def ack(self, receipt: str) -> None:
            raise EnvServerError(f"cannot ACK {receipt}: environment server env is away")

    script = lambda sibling, attempt: (0.0, RolloutOutcome.FINISHED)
    settled, stats, plane, _, env = run_one_group(script, timeout_s=5, max_attempts=1, env_class=DeadOnAck)
    assert settled == [(settled[0][0], True)] and stats.rows_sealed == 2 and plane.num_rows() == 2
    assert plane.pending_acks.receipts() == []
    assert any("could not ACK receipt" in r.getMessage() and "after its lease" in r.getMessage()
               for r in caplog.records)


def _no_backoff(real_sleep):
    async def sleep(delay, *args):
        return await real_sleep(0 if delay >= 0.2 else delay, *args)

    return sleep
