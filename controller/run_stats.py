"""Counters the pumps update and the metrics line reads."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RunStats:
    generated_tokens: int = 0
    rows_sealed: int = 0
    retries: int = 0
    siblings_dropped: Counter[str] = field(default_factory=Counter)
    groups_discarded: Counter[str] = field(default_factory=Counter)

    def take_generated_tokens(self) -> int:
        tokens, self.generated_tokens = self.generated_tokens, 0
        return tokens
