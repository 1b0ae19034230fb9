"""The lab environment: a calculator living in a separate child process that cannot be saved."""

import asyncio
import os
import signal

import pytest

from turnkeep.envs.calc_task import CalcCall, run_tool
from turnkeep.envs.lab_env import LabEnvironment
from turnkeep.schemas.rollout import Problem

PROBLEM = Problem(question="Q 37+48-12", answer=73, env="lab")
PERFECT = ["C 37+48\n", "C 85-12\n", "A 73\n"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_correct_episode_scores_one_in_a_separate_live_process() -> None:
    async def main() -> None:
        env = LabEnvironment(PROBLEM)
        assert env.pid is None  # started lazily, on the first call
        assert (await env.step(PERFECT[0])).observation == "R 85\n"
        pid = env.pid
        assert pid is not None and pid != os.getpid() and _alive(pid)
        assert (await env.step(PERFECT[1])).observation == "R 73\n"
        assert env.pid == pid and env.calls_served == 2  # one process, its own count
        result = await env.step(PERFECT[2])
        assert result.done and result.observation is None
        assert env.reward() == 1.0 and _alive(pid)
        await env.close()
        assert env.pid is None and not _alive(pid)

    asyncio.run(main())


@pytest.mark.parametrize(
    "turns",
    [
        ["C 37+48\n", "C 85-12\n", "A 74\n"],  # wrong answer
        ["C 37+48\n", "A 73\n"],  # skipped a call
        ["C 37+48\n", "oops\n"],  # malformed turn
    ],
)
def test_wrong_episode_scores_zero(turns: list[str]) -> None:
    async def main() -> None:
        env = LabEnvironment(PROBLEM)
        results = [await env.step(t) for t in turns]
        assert results[-1].done and results[-1].observation is None
        assert env.reward() == 0.0
        await env.close()

    asyncio.run(main())


def test_replies_equal_the_calculator() -> None:
    calls = [CalcCall(37, "+", 48), CalcCall(-3, "-", 27), CalcCall(6, "*", -7), CalcCall(-5, "-", -12)]

    async def main() -> None:
        env = LabEnvironment(PROBLEM)
        for n, call in enumerate(calls, start=1):
            assert (await env.step(call.text())).observation == run_tool(call)
            assert env.calls_served == n
        await env.close()

    asyncio.run(main())


def test_a_malformed_first_turn_never_starts_the_process() -> None:
    async def main() -> None:
        env = LabEnvironment(PROBLEM)
        result = await env.step("C 37 + 48\n")
        assert result.done and result.observation is None and env.pid is None
        await env.close()

    asyncio.run(main())


def test_a_dead_process_is_reported_with_its_exit_code() -> None:
    async def main() -> None:
        env = LabEnvironment(PROBLEM)
        await env.step(PERFECT[0])
        assert env.pid is not None
        os.kill(env.pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match=f"exit code {-signal.SIGKILL}"):
            await env.step(PERFECT[1])
        await env.close()

    asyncio.run(main())


def test_state_cannot_be_saved() -> None:
    env = LabEnvironment(PROBLEM)
    assert env.export_state() is None
    with pytest.raises(NotImplementedError, match="do not restore"):
        env.restore_state({"turns": []})
    with pytest.raises(NotImplementedError, match="cannot be replayed"):
        asyncio.run(env.replay(PERFECT))
    assert env.pid is None


def test_close_is_idempotent_and_safe_if_never_started() -> None:
    async def main() -> None:
        await LabEnvironment(PROBLEM).close()
        env = LabEnvironment(PROBLEM)
        await env.step(PERFECT[0])
        await env.close()
        await env.close()

    asyncio.run(main())
