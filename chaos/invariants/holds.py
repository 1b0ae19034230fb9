"""Invariant 4: the hold sets are released on every exit path, and a lease bounds every hold.

`hold_spans` rebuilds, from `hold_changed` events alone, how long each holder held each hold set
(the controller's admission gate and rollout deadline clocks; the trainer's hold and the policy
server's admission gate, sampled from their processes): from its taking to its release, or to
where its lease ran out, as the hold set itself would drop it. The deadline check
(invariant 5) measures parked time on the same spans.

`invariant_4` keeps the older checks (the holders `run_ended` reports; an incarnation that never
trains after its restore); `holds_within_lease` flags, while the run lives and not only at a clean
exit, a holder that was never released though its incarnation lived on past its lease (only the
lease let go of it), and any holder still held at a clean end.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from turnkeep.chaos.invariants.results import InvariantResult, not_checked
from turnkeep.chaos.invariants.timeline import last_heard
from turnkeep.schemas.audit import HoldChanged, Restored, RunEnded, StepTrained
from turnkeep.schemas.choices import HoldChange

STALL_AFTER_RESTORE_S = 90.0
"""A restored incarnation that lives this long without a single step has a hold left behind."""
LEASE_SLACK_S = 2.0
"""How late after its lease a release or renewal may come (event times are taken after the change)."""
UNLEASED_HOLD_LIMIT_S = STALL_AFTER_RESTORE_S
"""A holder without a lease (a restore's pause) held this long while the run lives is stuck."""


@dataclass
class HoldSpan:
    inc: int
    hold: str
    """The hold set (`admission`, `deadlines`)."""
    holder: str
    start: float
    lease_end: float | None
    """When the lease last taken or renewed runs out (None: no lease)."""
    released_at: float | None = None
    """When the holder released it, if it did before the end of its incarnation's log."""
    retaken_at: float | None = None
    """When the holder took it again after this span's lease had dropped it (a new span starts there)."""

    def end(self) -> float | None:
        """When the hold set stopped being held by it: the release, or the lease running out (None: neither)."""
        ends = [t for t in (self.released_at, self.lease_end) if t is not None]
        return min(ends) if ends else None

    def lapsed(self, slack_s: float) -> bool:
        """Its lease ran out before it was released (or renewed)."""
        return self.lease_end is not None and (self.released_at is None or self.released_at > self.lease_end + slack_s)


def hold_spans(events: list, slack_s: float = LEASE_SLACK_S) -> list[HoldSpan]:
    """Every holder's spans in every hold set, in the order they began, from the controller's events."""
    spans: list[HoldSpan] = []
    holding: dict[tuple[int, str, str], HoldSpan] = {}
    for event in events:
        if not isinstance(event, HoldChanged):
            continue
        for hold in event.holds:
            key = (event.inc, hold, event.holder)
            span = holding.get(key)
            if event.change == HoldChange.RELEASED:
                if span is not None:
                    span.released_at = event.t  # perhaps after its lease ran out: that span lapsed
                    del holding[key]
                continue
            if span is not None and span.lease_end is not None and event.t > span.lease_end + slack_s:
                # The hold set dropped it when its lease ran out: this change meets a holder that is gone.
                span.retaken_at = event.t if event.change == HoldChange.TAKEN else None
                del holding[key]
                span = None
            if span is None:
                if event.change == HoldChange.TAKEN:  # a renewal of a holder that is gone renews nothing
                    lease_end = None if event.lease_s is None else event.t + event.lease_s
                    span = HoldSpan(event.inc, hold, event.holder, event.t, lease_end)
                    holding[key] = span
                    spans.append(span)
            elif event.lease_s is not None:  # taken again or renewed: the lease starts over, the span goes on
                span.lease_end = event.t + event.lease_s
    return spans


def parked_intervals(spans: list[HoldSpan], hold: str, last: dict[int, float]) -> dict[int, list[tuple[float, float]]]:
    """Per incarnation, the merged stretches during which `hold` had any holder (up to its last event)."""
    by_inc: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for span in spans:
        if span.hold != hold:
            continue
        end = span.end()
        end = last.get(span.inc, span.start) if end is None else min(end, last.get(span.inc, end))
        if end > span.start:
            by_inc[span.inc].append((span.start, end))
    merged: dict[int, list[tuple[float, float]]] = {}
    for inc, stretches in by_inc.items():
        out: list[tuple[float, float]] = []
        for start, end in sorted(stretches):
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        merged[inc] = out
    return merged


def overlap(stretches: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in stretches)


def invariant_4(events: list, stall_after_s: float = STALL_AFTER_RESTORE_S) -> InvariantResult:
    violations: list[str] = []
    checked = 0
    for event in events:
        # Every exit path, not only the last one: an incarnation that ended on its own must let go too.
        if isinstance(event, RunEnded):
            checked += 1
            held = {
                "admission": event.admission_holders, "deadlines": event.deadline_holders,
                "trainer": event.trainer_holders,
            }
            for hold, holders in held.items():
                if holders:
                    violations.append(f"incarnation {event.inc} ended with {hold} holders {sorted(holders)}")
    last_t: dict[int, float] = {}
    stepped_after_restore: dict[int, bool] = {}
    restored_t: dict[int, float] = {}
    for event in events:
        last_t[event.inc] = max(last_t.get(event.inc, event.t), event.t)
        if isinstance(event, Restored):
            restored_t[event.inc] = event.t
            stepped_after_restore[event.inc] = False
        elif isinstance(event, StepTrained) and event.inc in restored_t:
            stepped_after_restore[event.inc] = True
    for inc, t in restored_t.items():
        lived = last_t[inc] - t
        if lived >= stall_after_s:
            checked += 1
            if not stepped_after_restore[inc]:
                violations.append(
                    f"incarnation {inc} lived {lived:.0f}s after its restore without training a step "
                    "(a hold left behind?)"
                )
    return InvariantResult(4, "holds released; training resumes after restore", not violations,
                           checked, violations)


def holds_within_lease(
    events: list, spans: list[HoldSpan], slack_s: float = LEASE_SLACK_S,
    unleased_limit_s: float = UNLEASED_HOLD_LIMIT_S,
) -> InvariantResult:
    """A holder with a lease that was never released while its incarnation lived past the lease is stuck
    (only the lease let go of it); one without a lease must be released within `unleased_limit_s` while
    the run lives; none may still be held at a clean end. A holder released after its lease had already
    dropped it (its attempt stalled, say while Temporal restarted) is a note: the lease did its job.
    An item is one holder's span in one hold set."""
    name = "holds released or renewed within their lease"
    if not any(isinstance(e, HoldChanged) for e in events):
        return not_checked(4, name, "hold_changed")
    last = last_heard(events)
    ended_at = {e.inc: e.t for e in events if isinstance(e, RunEnded)}
    problems: dict[tuple[int, str, str], list[str]] = defaultdict(list)  # (inc, holder, problem) -> hold sets
    late = [(span.released_at or span.retaken_at) - span.lease_end for span in spans
            if span.lease_end is not None and (span.retaken_at is not None
                                               or (span.released_at is not None and span.lapsed(slack_s)))]
    for span in spans:
        problem = _span_problem(span, last[span.inc], ended_at.get(span.inc), slack_s, unleased_limit_s)
        if problem:
            problems[(span.inc, span.holder, problem)].append(span.hold)
    violations = [f"{holder} ({', '.join(holds)}) {problem} (incarnation {inc})"
                  for (inc, holder, problem), holds in problems.items()]
    note = (f"{len(late)} holds released (or taken again) after their lease had dropped them (up to "
            f"{max(late):.1f}s late)" if late else "")
    return InvariantResult(4, name, not violations, len(spans), violations, note)


def _span_problem(span: HoldSpan, last: float, ended: float | None, slack_s: float, limit_s: float) -> str | None:
    if span.released_at is not None or span.retaken_at is not None:
        return None  # the holder came back to it: released (perhaps late), or took it again
    if ended is not None and (span.lease_end is None or span.lease_end + slack_s > ended):
        return f"still held when the incarnation ended, {ended - span.start:.1f}s after it was taken"
    if span.lease_end is not None:
        if last <= span.lease_end + slack_s:
            return None  # the incarnation died before the lease ran out: the lease's job
        return (f"never released: its lease ran out {span.lease_end - span.start:.1f}s after it was taken (last "
                f"renewed or taken) and the incarnation lived {last - span.lease_end:.0f}s longer")
    if last - span.start > limit_s:
        return f"held without a lease for {last - span.start:.0f}s while the incarnation lived, never released"
    return None
