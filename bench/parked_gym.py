"""An environment server's checkpoint state without its HTTP server or policy: A agents
parked at a turn boundary, behind the real registry, turn records, receipts and holds.

Each agent is an asyncio task that goes through the server's own steps (`live`, a
`CalcEnvironment` stepped through its tool turns, a turn boundary committed per turn,
`park`), so the participant sees exactly what a real server would show it. A holder
of our own keeps the boundary gate shut, so the agents stay parked across attempts;
the snapshot's own holder comes and goes on top of it, as it would on a live server.
"""

from __future__ import annotations

import asyncio
import random

from turnkeep.bench.synthetic_rollouts import chain_problem, conversation, tool_turns
from turnkeep.envs.agent_registry import AgentPhase, AgentRegistry
from turnkeep.envs.calc_env import CalcEnvironment
from turnkeep.envs.env_participant import EnvParticipant, env_capabilities
from turnkeep.envs.kinds import environment_capabilities
from turnkeep.envs.receipts import ReceiptBook
from turnkeep.envs.turn_records import TurnRecords
from turnkeep.participants.core import ParticipantCore
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.config import EnvironmentSpec
from turnkeep.schemas.rollout import RolloutRequest, Segment, TurnBoundary

PARKED_HOLDER = "bench:keep-parked"
PARK_POLL_S = 0.02


class ParkedGym:
    """The environment participant (`core`) over agents that are all parked."""

    def __init__(self) -> None:
        self.door = HoldSet("env-door")
        self.gate = HoldSet("boundary-gate")
        self.registry = AgentRegistry(self.door, self.gate)
        self.records = TurnRecords()
        self.receipts = ReceiptBook()  # stays empty: every finished result was ACKed
        self.core = ParticipantCore(
            env_capabilities(environment_capabilities({"calc": EnvironmentSpec()}, 8)),
            EnvParticipant(self.registry, self.records, self.receipts, self.door, self.gate)
        )
        self.requests: list[RolloutRequest] = []
        self._agents: list[asyncio.Task[None]] = []

    async def park(self, count: int, turns: int, rng: random.Random) -> None:
        """Start `count` agents, each in its own group (sibling 0, attempt 0), and wait until all are parked."""
        self.gate.add(PARKED_HOLDER)
        for index in range(count):
            group_id = f"p{index:07d}"
            request = RolloutRequest(
                rollout_id=f"{group_id}.0.0", group_id=group_id, sibling=0, attempt=0,
                problem=chain_problem(rng, turns),
            )
            self.requests.append(request)
            self._agents.append(asyncio.create_task(self._agent(request, conversation(rng, turns))))
        # Looked at every few ms, not at every loop turn: scanning 10k agents per turn made parking them quadratic.
        while self.registry.count(AgentPhase.PARKED) < count:
            ended, _ = await asyncio.wait(self._agents, timeout=PARK_POLL_S, return_when=asyncio.FIRST_COMPLETED)
            if ended:
                failed = next(iter(ended))
                failed.result()  # raises what stopped the agent before it parked
                raise RuntimeError(f"agent task ended before parking: {failed}")

    async def release(self) -> None:
        """Let the agents go and wait for them to leave the registry."""
        self.gate.release(PARKED_HOLDER)
        await asyncio.gather(*self._agents)
        self._agents.clear()

    async def _agent(self, request: RolloutRequest, segments: list[Segment]) -> None:
        env = CalcEnvironment(request.problem)
        async with self.registry.live(request, env) as agent:
            for turn, text in enumerate(tool_turns(request.problem), start=1):
                await env.step(text)
                # Boundary after turn t: the prompt plus t (policy, tool) pairs.
                self.records.commit(
                    TurnBoundary(rollout_id=request.rollout_id, turn_index=turn, segments=segments[: 1 + 2 * turn])
                )
            await self.registry.park(agent)
        self.records.forget(request.rollout_id)
