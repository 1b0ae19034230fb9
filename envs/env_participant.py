"""The environment server as a checkpoint participant: park agents, save them, let them go.

prepare closes the server's door (a new /run waits before it starts, holding no
state) and holds the boundary gate, both as holder `snapshot:<checkpoint_id>`. Agents
that are mid-turn finish that turn (policy call and tool call) and park at the
boundary they then commit. Ready means: no agent mid-turn, and every finished result
ACKed (a result the controller has not stored yet would be in neither the snapshot's
agents nor its data plane).

Ordering with the policy server: a mid-turn agent needs its policy call to go
through, so the coordinator prepares the environment servers first, waits until they
are ready (all agents parked), and only then prepares the policy server, which then
merely fences and drains. Preparing the policy server first would park agents in the
middle of a turn, waiting at the policy's gate, and this participant would never
become ready.

commit writes `<directory>/agents.jsonl`: one `SavedAgent` per parked agent (its
request, its newest turn boundary, its environment's exported state).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import orjson

from turnkeep.envs.agent_registry import AgentPhase, AgentRegistry, LiveAgent
from turnkeep.envs.receipts import ReceiptBook
from turnkeep.envs.turn_records import TurnRecords
from turnkeep.participants.core import Quiescence
from turnkeep.primitives.atomic_files import atomic_write_bytes, fsync_dir
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.environments import EnvironmentCapabilities
from turnkeep.schemas.names import snapshot_holder
from turnkeep.schemas.participant import Capabilities, SavedAgent

AGENTS_FILE = "agents.jsonl"



def env_capabilities(
    environments: list[EnvironmentCapabilities], name: str = "env", journals_turns: bool = False,
) -> Capabilities:
    return Capabilities(name=name, kind="environment", saves_state=True, environments=environments,
                        journals_turns=journals_turns)


class EnvParticipant:
    """`ParticipantHooks` of the environment server."""

    def __init__(
        self, agents: AgentRegistry, records: TurnRecords, receipts: ReceiptBook, door: HoldSet, gate: HoldSet,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        # Flushes the audit log: every turn a snapshot saves must already be in it.
        self._before_write = before_write
        self._agents = agents
        self._records = records
        self._receipts = receipts
        self._door = door
        self._gate = gate

    def on_prepare(self, checkpoint_id: str, lease_s: float) -> None:
        # No lease on these holds: the participant core's lease releases them, so the
        # door, the gate and the core's state always change together.
        holder = snapshot_holder(checkpoint_id)
        self._door.add(holder)
        self._gate.add(holder)

    def on_release(self, checkpoint_id: str) -> None:
        holder = snapshot_holder(checkpoint_id)
        self._door.release(holder)
        self._gate.release(holder)

    def status_counts(self) -> Quiescence:
        mid_turn = self._agents.count(AgentPhase.MID_TURN)
        unacked = self._receipts.unacked()
        parked = self._agents.parked()
        unbounded = [a.request.rollout_id for a in parked if self._records.latest(a.request.rollout_id) is None]
        problems = []
        if mid_turn:
            ids = self._agents.ids(AgentPhase.MID_TURN)
            problems.append(f"{mid_turn} agents mid-turn (waiting for their turn to end: {', '.join(ids[:3])}"
                            + (f" and {mid_turn - 3} more)" if mid_turn > 3 else ")"))
        if unacked:
            problems.append(f"{unacked} finished results not ACKed by the controller: {self._receipts.waiting_on()}")
        if unbounded:
            problems.append(f"parked without a turn boundary: {unbounded[:5]}")
        return Quiescence(
            ready=not problems,
            running=mid_turn,
            parked=len(parked),
            waiting=self._agents.count(AgentPhase.WAITING),
            unacked=unacked,
            detail="; ".join(problems),
        )

    async def write(self, directory: Path) -> tuple[list[Path], dict[str, int]]:
        # Collected without an await, so every agent is captured at the same instant.
        saved = [self._saved(agent) for agent in self._agents.parked()]
        if self._before_write is not None:
            self._before_write()
        data = b"".join(orjson.dumps(s.model_dump(mode="json"), option=orjson.OPT_APPEND_NEWLINE) for s in saved)
        path = directory / AGENTS_FILE
        await asyncio.to_thread(_write_durably, path, data)
        return [path], {"parked_agents": len(saved)}

    def _saved(self, agent: LiveAgent) -> SavedAgent:
        rollout_id = agent.request.rollout_id
        boundary = self._records.latest(rollout_id)
        if boundary is None:
            # status_counts reports such an agent as not ready, so commit never gets here.
            raise RuntimeError(f"agent {rollout_id} is parked without a turn boundary")
        return SavedAgent(request=agent.request, boundary=boundary, env_state=agent.env.export_state())


def _write_durably(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fsync_dir(path.parent.parent)
    atomic_write_bytes(path, data)
