import asyncio
import time

from turnkeep.envs.slow_tools import slow_tools
from turnkeep.participants.faults import FaultInjector
from turnkeep.schemas.participant import FaultPlan


class _Tool:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def step(self, turn_text: str) -> str:
        self.calls.append(turn_text)
        return f"observed {turn_text}"


def test_a_slowed_environment_waits_before_each_tool_call_and_answers_as_before() -> None:
    env = _Tool()
    assert slow_tools(env, 0.2) is env
    began = time.monotonic()
    assert asyncio.run(env.step("2+2")) == "observed 2+2"
    assert time.monotonic() - began >= 0.2
    assert env.calls == ["2+2"]


def test_no_delay_leaves_the_environment_alone() -> None:
    env = _Tool()
    step = env.step
    slow_tools(env, 0.0)
    assert env.step == step


def test_the_fault_plan_names_the_slow_environment_only() -> None:
    faults = FaultInjector()
    faults.set(FaultPlan(tool_delay_s={"calc": 1.5}))
    assert faults.tool_delay_s("calc") == 1.5 and faults.tool_delay_s("judge") == 0.0
