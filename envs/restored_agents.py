"""Saved agents a restore hands back to the environment server, held until continued.

`load` reads this participant's `agents.jsonl` from the chosen snapshot and checks
every agent can be rebuilt: an exported environment must accept its saved state, a
stateless or replay one is replayed when it continues, and a restart_only one cannot continue at
all (it is counted, not held). A `/run` with `resume_from` then takes its agent and
continues it from the saved boundary. An agent that is never asked for is dropped with
the table: the controller reruns its sibling from scratch.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from turnkeep.envs.env_participant import AGENTS_FILE
from turnkeep.envs.kinds import EnvironmentFactory
from turnkeep.schemas.choices import RecoveryMode
from turnkeep.schemas.participant import SavedAgent


class RestoreError(ValueError):
    """The saved agents cannot be restored; the message names the file, line and problem."""


class RestoredAgents:
    def __init__(self, factory: EnvironmentFactory) -> None:
        self._factory = factory
        self._saved: dict[str, SavedAgent] = {}

    async def load(self, directory: Path) -> tuple[list[str], list[str]]:
        """Hold the folder's saved agents; returns (held rollout ids, restart_only ones that cannot continue)."""
        path = Path(directory) / AGENTS_FILE
        if not path.exists():
            raise RestoreError(f"{path} does not exist; restore from the snapshot folder that holds {AGENTS_FILE}")
        lines = (await asyncio.to_thread(path.read_bytes)).splitlines()
        saved: list[tuple[str, SavedAgent]] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                saved.append((f"{path} line {number}", SavedAgent.model_validate_json(line)))
            except ValueError as err:
                raise RestoreError(f"{path} line {number}: not a restorable saved agent: {err}") from None
        return await self.hold(saved)

    async def hold(self, saved: list[tuple[str, SavedAgent]]) -> tuple[list[str], list[str]]:
        """Hold these saved agents (each with where it was read, for errors) in place of any held before;
        returns (held rollout ids, restart_only ones that cannot continue)."""
        loaded: dict[str, SavedAgent] = {}
        cannot_continue: list[str] = []
        for where, agent in saved:
            try:
                if not await self._restorable(agent):
                    cannot_continue.append(agent.request.rollout_id)
                    continue
            except ValueError as err:
                raise RestoreError(f"{where}: not a restorable saved agent: {err}") from None
            loaded[agent.request.rollout_id] = agent
        self._saved = loaded
        return sorted(loaded), sorted(cannot_continue)

    def peek(self, rollout_id: str) -> SavedAgent | None:
        return self._saved.get(rollout_id)

    async def _restorable(self, saved: SavedAgent) -> bool:
        kind = self._factory.kind_of(saved.request.problem.env)
        mode = self._factory.mode_of(saved.request.problem.env)
        if mode == RecoveryMode.RESTART_ONLY:
            return False
        if mode == RecoveryMode.EXPORTED:
            if saved.env_state is None:
                raise ValueError(f"{kind.kind} environments export their state, but env_state is null")
            env = self._factory.make_for(saved.request)
            try:
                env.restore_state(saved.env_state)
            finally:
                await env.close()
        return True

    def take(self, rollout_id: str) -> SavedAgent | None:
        return self._saved.pop(rollout_id, None)

    def held(self) -> int:
        return len(self._saved)
