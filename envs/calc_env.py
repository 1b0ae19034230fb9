"""The default environment: arithmetic where every operation goes through a calculator tool."""

from __future__ import annotations

import asyncio

from turnkeep.envs.calc_task import CalcCall, parse_action, run_tool, score
from turnkeep.envs.environment import EnvContext, Environment, StepResult
from turnkeep.schemas.rollout import Problem


class CalcEnvironment(Environment):
    """Stateless: the calculator is a pure function of each call, so replaying the turns rebuilds it."""

    kind = "calc"
    recovery_mode = "stateless"

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        self._problem = problem
        self._tool_latency_s = ctx.tool_latency_s
        self._turns: list[str] = []

    def prompt(self) -> str:
        return self._problem.question + "\n"

    async def step(self, turn_text: str) -> StepResult:
        self._turns.append(turn_text)
        action = parse_action(turn_text)
        if isinstance(action, CalcCall):
            if self._tool_latency_s:
                await asyncio.sleep(self._tool_latency_s)
            return StepResult(observation=await self._call_tool(action), done=False)
        return StepResult(observation=None, done=True)

    async def _call_tool(self, call: CalcCall) -> str:
        """The tool's reply line; the other kinds keep the same task and change only where the tool runs."""
        return run_tool(call)

    def reward(self) -> float:
        return score(self._problem, self._turns)

    @property
    def turns(self) -> list[str]:
        return list(self._turns)
