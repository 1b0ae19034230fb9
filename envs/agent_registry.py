"""Live agents and where each one is, so a checkpoint knows when they are all parked.

An agent is in one of three phases:

- `waiting`: its /run arrived while a checkpoint held the server's door; it has not
  started and holds no state, so it needs no saving.
- `mid_turn`: calling the policy or a tool; a checkpoint must wait for it.
- `parked`: it committed a turn boundary and waits on the boundary gate; its newest
  boundary record (plus its environment's exported state) is all a snapshot needs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum

from turnkeep.envs.environment import Environment
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.rollout import RolloutRequest


class AgentPhase(StrEnum):
    WAITING = "waiting"
    MID_TURN = "mid_turn"
    PARKED = "parked"


@dataclass
class LiveAgent:
    request: RolloutRequest
    phase: AgentPhase
    env: Environment


class AgentRegistry:
    def __init__(self, door: HoldSet, boundary_gate: HoldSet) -> None:
        self._door = door
        self._gate = boundary_gate
        self._agents: dict[str, LiveAgent] = {}

    @asynccontextmanager
    async def live(self, request: RolloutRequest, env: Environment) -> AsyncIterator[LiveAgent]:
        """Wait at the door, then hold the agent of `env` as live (mid-turn) until the block exits."""
        agent = LiveAgent(request, AgentPhase.WAITING, env)
        self._agents[request.rollout_id] = agent
        try:
            await self._door.wait_clear()
            agent.phase = AgentPhase.MID_TURN
            yield agent
        finally:
            del self._agents[request.rollout_id]

    async def park(self, agent: LiveAgent) -> None:
        """Called right after a committed turn boundary: wait while a checkpoint holds the gate."""
        agent.phase = AgentPhase.PARKED
        try:
            await self._gate.wait_clear()
        finally:
            agent.phase = AgentPhase.MID_TURN

    def count(self, phase: AgentPhase) -> int:
        return sum(agent.phase is phase for agent in self._agents.values())

    def ids(self, phase: AgentPhase) -> list[str]:
        return [rollout_id for rollout_id, agent in self._agents.items() if agent.phase is phase]

    def parked(self) -> list[LiveAgent]:
        return [agent for agent in self._agents.values() if agent.phase is AgentPhase.PARKED]
