"""Invariant 5: a rollout's deadline never runs while the rollout is parked by a snapshot.

Measured against wall time, not the deadline clock's own reading: a rollout that timed out had,
between its start (`sibling_started`) and its expiry, at least its budget of wall time outside
the stretches the deadline hold set was held (`hold_changed` on `deadlines`, each stretch ending
at its release or where its lease ran out). Its start is taken when the pump announces the
attempt, a moment before the clock starts, and a rollout whose start is not in the log is
measured from its incarnation's start: both only lengthen the time it may have run, so a
violation found is a real one. The clock's own `running_s` is checked as well.
"""

from __future__ import annotations

from turnkeep.chaos.invariants.holds import HoldSpan, overlap, parked_intervals
from turnkeep.chaos.invariants.results import InvariantResult, joined
from turnkeep.chaos.invariants.timeline import last_heard, started_at
from turnkeep.schemas.audit import DeadlineExpired, HoldChanged, SiblingStarted

DEADLINE_SLACK_S = 0.05
"""Clock granularity a deadline may fire early by (the registry's timer is not exact)."""
DEADLINE_HOLDS = "deadlines"


def invariant_5(events: list, spans: list[HoldSpan], slack_s: float = DEADLINE_SLACK_S) -> InvariantResult:
    expired = [e for e in events if isinstance(e, DeadlineExpired)]
    started = {(e.inc, e.rollout_id): e.t for e in events if isinstance(e, SiblingStarted)}
    incarnation_started = started_at(events)
    parked = parked_intervals(spans, DEADLINE_HOLDS, last_heard(events))
    violations: list[str] = []
    from_incarnation = 0
    for e in expired:
        start = started.get((e.inc, e.rollout_id))
        if start is None:
            from_incarnation += 1
            start = incarnation_started[e.inc]
        wall = e.t - start
        parked_s = overlap(parked.get(e.inc, []), start, e.t)
        ran = wall - parked_s
        if ran < e.budget_s - slack_s:
            why = f"{parked_s:.2f}s of them parked: its deadline ran while parked" if parked_s else \
                "none of them parked: its deadline fired early"
            violations.append(f"{e.rollout_id} timed out {wall:.2f}s of wall time after it started, {why} "
                              f"({ran:.2f}s of its {e.budget_s:.2f}s budget; incarnation {e.inc})")
        elif e.running_s < e.budget_s - slack_s:
            violations.append(f"{e.rollout_id} timed out after {e.running_s:.2f}s of its {e.budget_s:.2f}s budget "
                              f"(incarnation {e.inc})")
    notes = []
    if expired and not any(isinstance(e, HoldChanged) for e in events):
        notes.append("parked time unknown (no hold_changed events in this log): measured against wall time alone")
    if from_incarnation:
        notes.append(f"{from_incarnation} rollouts without sibling_started measured from their incarnation's start")
    return InvariantResult(5, "no deadline ran while parked", not violations, len(expired), violations,
                           joined(*notes))
