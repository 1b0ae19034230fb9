"""Invariant 3: a crash at any moment leaves the newest published snapshot intact and loadable."""

from __future__ import annotations

from collections.abc import Sequence

from turnkeep.chaos.invariants.results import InvariantResult
from turnkeep.schemas.audit import Restored


def invariant_3(events: list, problems: Sequence[str], snapshot_checks: int) -> InvariantResult:
    """`problems`: what the chaos command found wrong with the newest published snapshot after its kills."""
    violations = list(problems)
    restores = 0
    for event in events:
        if isinstance(event, Restored):
            restores += 1
            # No kill may make a published snapshot or checkpoint fail verification.
            violations += [
                f"restore of incarnation {event.inc} skipped {s.path}: {s.problem} ({s.detail})" for s in event.skipped
            ]
    return InvariantResult(3, "newest published snapshot intact after crashes", not violations,
                           restores + snapshot_checks, violations)
