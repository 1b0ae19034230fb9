"""The default environment: arithmetic where every operation goes through a calculator tool."""

from __future__ import annotations

import asyncio
from typing import Any

from envs.calc_task import CalcCall, FinalAnswer, parse_action, run_tool, score
from envs.environment import Environment, StepResult
from schemas.rollout import Problem


class CalcEnvironment(Environment):
    def __init__(self, problem: Problem, tool_latency_s: float = 0.0) -> None:
        self._problem = problem
        self._tool_latency_s = tool_latency_s
        self._turns: list[str] = []

    def prompt(self) -> str:
        return self._problem.question + "\n"

    async def step(self, turn_text: str) -> StepResult:
        self._turns.append(turn_text)
        action = parse_action(turn_text)
        if isinstance(action, CalcCall):
            if self._tool_latency_s:
                await asyncio.sleep(self._tool_latency_s)
            return StepResult(observation=run_tool(action), done=False)
        return StepResult(observation=None, done=True)

    def export_state(self) -> dict[str, Any]:
        # The policy turns are all the state there is: tool results follow from them.
        return {"turns": list(self._turns)}

    def restore_state(self, state: dict[str, Any]) -> None:
        turns = state.get("turns")
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"calc env state needs 'turns': a list of strings, got {state!r}")
        self._turns = list(turns)

    def reward(self) -> float:
        return score(self._problem, self._turns)

    @property
    def answered(self) -> bool:
        return bool(self._turns) and isinstance(parse_action(self._turns[-1]), FinalAnswer)
