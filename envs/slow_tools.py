"""An injected slow tool (`FaultPlan.tool_delay_s`, tests and benchmarks only): every `step`
of one environment instance waits first, so its agents stay mid-rollout long enough for a
snapshot to find them running, whatever the speed of the machine."""

from __future__ import annotations

import asyncio

from turnkeep.envs.environment import Environment, StepResult


def slow_tools(env: Environment, delay_s: float) -> Environment:
    """`env`, its tool calls `delay_s` seconds slower (the instance is changed, not wrapped: the turn
    records and the audit keep seeing the environment's own type)."""
    if delay_s <= 0:
        return env
    step = env.step

    async def slow_step(turn_text: str) -> StepResult:
        await asyncio.sleep(delay_s)
        return await step(turn_text)

    env.step = slow_step  # type: ignore[method-assign]
    return env
