"""The small interface every environment implements: the agent loop drives it turn by turn."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepResult:
    observation: str | None
    """Text fed back to the policy (a tool result), or None when the episode is over."""
    done: bool
    """True after a final answer or a malformed turn."""


class Environment(ABC):
    """One episode: `prompt()`, then `step(turn_text)` per policy turn, then `reward()`.

    A snapshot saves a parked agent's environment with `export_state()` at a turn
    boundary; a restore builds a fresh environment for the same problem and hands the
    state to `restore_state()`, so the episode continues as if never interrupted.
    """

    @abstractmethod
    def prompt(self) -> str:
        """The first line the policy sees, newline included."""

    @abstractmethod
    async def step(self, turn_text: str) -> StepResult:
        """Act on one generated turn (call tools); may take time."""

    @abstractmethod
    def reward(self) -> float:
        """The verifier's reward for the episode so far."""

    @abstractmethod
    def export_state(self) -> dict[str, Any]:
        """JSON-ready state at a turn boundary (what `step` has accumulated so far)."""

    @abstractmethod
    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from `export_state()`'s output; only called on a fresh environment."""
