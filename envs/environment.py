"""The small interface every environment implements: the agent loop drives it turn by turn."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class StepResult:
    observation: str | None
    """Text fed back to the policy (a tool result), or None when the episode is over."""
    done: bool
    """True after a final answer or a malformed turn."""


class Environment(ABC):
    """One episode: `prompt()`, then `step(turn_text)` per policy turn, then `reward()`."""

    @abstractmethod
    def prompt(self) -> str:
        """The first line the policy sees, newline included."""

    @abstractmethod
    async def step(self, turn_text: str) -> StepResult:
        """Act on one generated turn (call tools); may take time."""

    @abstractmethod
    def reward(self) -> float:
        """The verifier's reward for the episode so far."""
