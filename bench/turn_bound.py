"""The slowest in-flight turn of each snapshot attempt, read from the audit log alone.

For the lower bound an attempt's parking is compared with, the product's own figure
(`agents_parked_s`, timed by the code that parks) is not used: here the moment admission
closed is the controller's `hold_changed` event, the agents running then are the
siblings started and not yet sealed or failed, and the moment each reached its boundary
is the environment server's own `turn_committed` event for it. The slowest of them is
the least time any snapshot that parks agents at turn boundaries could need.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from turnkeep.schemas.choices import HoldChange

SNAPSHOT_PREFIX = "snapshot:"


@dataclass
class _Closure:
    closed_t: float
    running: frozenset[str]
    reached: dict[str, float] = field(default_factory=dict)
    released_t: float | None = None


@dataclass(frozen=True)
class TurnBound:
    attempt: str
    """The attempt's checkpoint id."""
    slowest_turn_s: float
    """From admission closing until the last agent running then committed its next boundary (0: none ran)."""
    agents: int
    """Agents running when admission closed."""


def turn_bounds(events) -> dict[str, TurnBound]:
    """Per attempt that closed admission, by checkpoint id."""
    running: set[str] = set()
    closures: dict[str, _Closure] = {}
    for event in sorted(events, key=lambda e: e.t):
        kind = event.event
        if kind == "sibling_started":
            running.add(event.rollout_id)
        elif kind in ("sibling_sealed", "sibling_failed"):
            running.discard(event.rollout_id)
        elif kind == "hold_changed" and event.holder.startswith(SNAPSHOT_PREFIX) and "admission" in event.holds:
            attempt = event.holder.removeprefix(SNAPSHOT_PREFIX)
            if event.change == HoldChange.TAKEN and attempt not in closures:
                closures[attempt] = _Closure(event.t, frozenset(running))
            elif event.change == HoldChange.RELEASED and attempt in closures:
                closures[attempt].released_t = closures[attempt].released_t or event.t
        elif kind == "turn_committed":
            for closure in closures.values():
                if (closure.released_t is None and event.rollout_id in closure.running
                        and event.rollout_id not in closure.reached):
                    closure.reached[event.rollout_id] = event.t
    return {attempt: TurnBound(attempt, round(max((t - c.closed_t for t in c.reached.values()), default=0.0), 4),
                               len(c.running))
            for attempt, c in closures.items()}
