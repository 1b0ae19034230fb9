"""Counters the pumps update and the metrics line reads."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass
class RunStats:
    generated_tokens: int = 0
    rows_sealed: int = 0
    retries: int = 0
    """Sibling attempts that failed and were tried again (each spends one of `rollout.max_attempts`)."""
    interrupted: int = 0
    """Sibling attempts cut off by their environment server's absence: run again once it is back, spending no
    attempt."""
    siblings_dropped: Counter[str] = field(default_factory=Counter)
    groups_discarded: Counter[str] = field(default_factory=Counter)
    recovery_by_env: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    """Per environment: groups_retried_whole (a live failure in a group-scored environment),
    groups_rerun_whole (the prompt_group level, live or at a restore), sealed_discarded (by either),
    resumed_from_turn and rerun_from_scratch (sibling attempts that redo lost work)."""

    def take_generated_tokens(self) -> int:
        tokens, self.generated_tokens = self.generated_tokens, 0
        return tokens
