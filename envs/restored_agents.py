"""Saved agents a restore hands back to the environment server, held until continued.

`load` reads this participant's `agents.jsonl` from the chosen snapshot and checks
every agent can be rebuilt (its environment accepts the saved state); a `/run` with
`resume_from` then takes its agent and continues it from the saved boundary. An agent
that is never asked for is simply dropped with the table: the controller reruns its
sibling from scratch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from envs.environment import Environment
from envs.env_participant import AGENTS_FILE
from schemas.participant import SavedAgent
from schemas.rollout import Problem


class RestoreError(ValueError):
    """The saved agents cannot be restored; the message names the file, line and problem."""


class RestoredAgents:
    def __init__(self, make_env: Callable[[Problem], Environment]) -> None:
        self._make_env = make_env
        self._saved: dict[str, SavedAgent] = {}

    def load(self, directory: Path) -> list[str]:
        path = Path(directory) / AGENTS_FILE
        if not path.exists():
            raise RestoreError(f"{path} does not exist; restore from the snapshot folder that holds {AGENTS_FILE}")
        loaded: dict[str, SavedAgent] = {}
        for number, line in enumerate(path.read_bytes().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                saved = SavedAgent.model_validate_json(line)
                self._make_env(saved.request.problem).restore_state(saved.env_state)
            except ValueError as err:
                raise RestoreError(f"{path} line {number}: not a restorable saved agent: {err}") from None
            loaded[saved.request.rollout_id] = saved
        self._saved = loaded
        return sorted(loaded)

    def take(self, rollout_id: str) -> SavedAgent | None:
        return self._saved.pop(rollout_id, None)

    def held(self) -> int:
        return len(self._saved)
