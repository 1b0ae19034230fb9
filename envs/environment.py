"""The small interface every environment implements: the agent loop drives it turn by turn."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from schemas.environments import RecoveryMode
from schemas.rollout import Problem


@dataclass(frozen=True)
class StepResult:
    observation: str | None
    """Text fed back to the policy (a tool result), or None when the episode is over."""
    done: bool
    """True after a final answer or a malformed turn."""


@dataclass(frozen=True)
class EnvContext:
    """What the environment server gives every environment it builds."""

    tool_latency_s: float = 0.0
    """Added latency of each tool call (to mimic slow tools)."""
    workspace_root: Path | None = None
    """Folder under which environments with files on disk make their own workspace (None: the system's temp)."""


class Environment(ABC):
    """One episode: `prompt()`, then `step(turn_text)` per policy turn, then `reward()`, then `close()`.

    How an episode comes back after a restore is the class's `recovery_mode`:
    - `stateless`: a fresh environment `replay()`s the saved policy turns (its tools are
      deterministic, so the replayed tool results equal the saved ones);
    - `exported`: a snapshot saves `export_state()` at a turn boundary and a fresh
      environment takes it back with `restore_state()`;
    - `restart_only`: the state cannot be saved (a live process, a remote session); the
      episode can only start over.
    A `group_scored` environment's reward comes from `score_group` over all siblings of a
    group together; `reward()` is then only a per-sibling preliminary.
    """

    kind: ClassVar[str]
    recovery_mode: ClassVar[RecoveryMode]
    group_scored: ClassVar[bool] = False

    @abstractmethod
    def __init__(self, problem: Problem, ctx: EnvContext) -> None: ...

    @abstractmethod
    def prompt(self) -> str:
        """The first line the policy sees, newline included."""

    @abstractmethod
    async def step(self, turn_text: str) -> StepResult:
        """Act on one generated turn (call tools); may take time."""

    @abstractmethod
    def reward(self) -> float:
        """The verifier's reward for the episode so far."""

    def export_state(self) -> dict[str, Any] | None:
        """JSON-ready state at a turn boundary (`exported` environments); None: nothing to export."""
        return None

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from `export_state()`'s output; only called on a fresh environment."""
        raise NotImplementedError(f"{self.kind} environments ({self.recovery_mode}) do not restore exported state")

    async def replay(self, turns: list[str]) -> list[str | None]:
        """Rebuild a fresh environment by stepping the saved policy turns again; returns each turn's observation."""
        if self.recovery_mode != "stateless":
            raise NotImplementedError(f"{self.kind} environments ({self.recovery_mode}) cannot be replayed")
        return [(await self.step(turn)).observation for turn in turns]

    async def close(self) -> None:
        """Release what the episode holds (files, processes); called once, however the episode ended."""

    @classmethod
    def score_group(cls, problem: Problem, sibling_turns: list[list[str]]) -> list[float]:
        """Rewards of all siblings of a group, scored together (`group_scored` environments only)."""
        raise NotImplementedError(f"{cls.kind} environments are not group-scored")
