"""Check DESIGN.md's invariants 1 to 5 after the fact, from a run's `audit.jsonl`.

`turnkeep chaos` kills a run many times and then calls `check_run_dir`; tests call
`check_invariants` on event lists they build. The checker trusts nothing the controller
says about itself except the events: every verdict is derived from what was trained,
restored, resumed and released, in file order.

Events of one incarnation are written by two processes (the controller and the
environment server), so their order in the file is only reliable across incarnations
(the old tree is dead before the new one starts) and among the controller's own
events. The checks below rely on file order only for controller events and on `inc`
and `t` for the rest.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from primitives.audit_log import read_audit
from schemas.audit import (
    ContinuationRef,
    DeadlineExpired,
    GroupAdmitted,
    GroupRerun,
    GroupsDiscarded,
    Restored,
    RunEnded,
    RunStarted,
    SiblingSealed,
    SiblingStarted,
    StepTrained,
    TurnCommitted,
)
from schemas.recovery import SourceKind

DEADLINE_SLACK_S = 0.05
"""Clock granularity a deadline may fire early by (the registry's timer is not exact)."""
STALL_AFTER_RESTORE_S = 90.0
"""A restored incarnation that lives this long without a single step has a hold left behind."""
MAX_LISTED_VIOLATIONS = 20
"""`format()` lists this many violations per invariant; the rest are counted."""


@dataclass
class InvariantResult:
    number: int
    name: str
    ok: bool
    checked: int
    """How many items the check looked at (see each check for what an item is)."""
    violations: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class AuditCounts:
    incarnations: int = 0
    restores_by_source: dict[str, int] = field(default_factory=dict)
    steps_trained: int = 0
    """Steps on the final lineage (abandoned branches excluded)."""
    groups_trained: int = 0
    """Groups trained on the final lineage."""
    continuations_restored: int = 0
    continuations_resumed: int = 0
    """Continuations whose attempt N+1 started or committed a turn."""
    continuations_sealed: int = 0
    """Continuations sealed with the saved boundary's prefix."""
    turns_committed: int = 0
    tokens_generated: int = 0
    tokens_regenerated: int = 0
    """Tokens generated after the cut that a later restore went back to (work a crash threw away)."""
    restart_to_first_generation_s: dict[int, float | None] = field(default_factory=dict)
    """Per resumed incarnation: seconds from `run_started` to its first committed turn (None: none)."""

    @property
    def tokens_regenerated_share(self) -> float:
        return self.tokens_regenerated / self.tokens_generated if self.tokens_generated else 0.0

    @property
    def median_restart_to_first_generation_s(self) -> float | None:
        seconds = [s for s in self.restart_to_first_generation_s.values() if s is not None]
        return statistics.median(seconds) if seconds else None

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            # JSON keys are strings: incarnation numbers become "2", "3", ...
            "restart_to_first_generation_s": {str(inc): s for inc, s in self.restart_to_first_generation_s.items()},
            "tokens_regenerated_share": self.tokens_regenerated_share,
            "median_restart_to_first_generation_s": self.median_restart_to_first_generation_s,
        }


@dataclass
class Verdict:
    results: list[InvariantResult]
    counts: AuditCounts

    @property
    def ok(self) -> bool:
        return all(result.ok for result in self.results)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "results": [asdict(r) for r in self.results], "counts": self.counts.to_dict()}

    def format(self) -> str:
        lines = [f"{'status':<17} #  {'invariant':<48} {'checked':>8}  result"]
        for r in self.results:
            status = "ok" if r.ok else "INVARIANT BROKEN"
            outcome = "ok" if r.ok else f"{len(r.violations)} violation{'s' if len(r.violations) != 1 else ''}"
            lines.append(f"{status:<17} {r.number}  {r.name:<48} {r.checked:>8}  {outcome}")
            for violation in r.violations[:MAX_LISTED_VIOLATIONS]:
                lines.append(f"{'':<20}- {violation}")
            if len(r.violations) > MAX_LISTED_VIOLATIONS:
                lines.append(f"{'':<20}- ... and {len(r.violations) - MAX_LISTED_VIOLATIONS} more")
            if r.note:
                lines.append(f"{'':<20}note: {r.note}")
        c = self.counts
        sources = ", ".join(f"{kind} {n}" for kind, n in sorted(c.restores_by_source.items())) or "none"
        median = c.median_restart_to_first_generation_s
        lines += [
            "",
            f"incarnations {c.incarnations}; restores: {sources}",
            f"final lineage: {c.steps_trained} steps, {c.groups_trained} groups trained",
            f"continuations: {c.continuations_restored} restored, {c.continuations_resumed} resumed, "
            f"{c.continuations_sealed} sealed on their saved prefix",
            f"turns committed {c.turns_committed}; tokens generated {c.tokens_generated}, regenerated "
            f"{c.tokens_regenerated} ({c.tokens_regenerated_share:.1%})",
            "restart -> first generation: "
            + (f"median {median:.1f}s over {sum(s is not None for s in c.restart_to_first_generation_s.values())}"
               f" restarts" if median is not None else "no restart generated a turn"),
        ]
        return "\n".join(lines)


def check_run_dir(run_dir: Path, *, newest_snapshot_problems: Sequence[str] = (), snapshot_checks: int = 0) -> Verdict:
    return check_invariants(
        list(read_audit(run_dir)), newest_snapshot_problems=newest_snapshot_problems, snapshot_checks=snapshot_checks,
    )


def check_invariants(
    events: list, *, newest_snapshot_problems: Sequence[str] = (), snapshot_checks: int = 0,
) -> Verdict:
    """`newest_snapshot_problems`: what the chaos command found wrong with the newest published
    snapshot after its kills; `snapshot_checks`: how many such checks it made (for the table)."""
    walk = _walk_lineage(events)
    counts = AuditCounts()
    results = [
        _invariant_1(events, walk),
        _invariant_2(events, counts),
        _invariant_3(events, newest_snapshot_problems, snapshot_checks),
        _invariant_4(events),
        _invariant_5(events),
    ]
    _fill_counts(events, walk, counts)
    return Verdict(results, counts)


# ---- invariant 1: trained once, never lost, never readmitted ----


@dataclass
class _LineageWalk:
    lineage: dict[int, tuple[int, int, list[str]]]
    """Final lineage: step -> (incarnation, event index, groups)."""
    accepted: set[int]
    """Indices of `step_trained` events that entered the lineage when they happened."""
    violations: list[str]
    checked: int


def _walk_lineage(events: list) -> _LineageWalk:
    lineage: dict[int, tuple[int, int, list[str]]] = {}
    accepted: set[int] = set()
    violations: list[str] = []
    checked = 0
    trained_at: dict[str, int] = {}  # group -> first step that trained it, on the lineage so far
    floor: int | None = 0  # restore step of the current incarnation (None: resumed, not restored yet)
    for index, event in enumerate(events):
        if isinstance(event, RunStarted):
            floor = None if event.resumed else 0
        elif isinstance(event, Restored):
            # The crash abandoned every step after the restored one: that branch never happened.
            for step in [s for s in lineage if s > event.step]:
                del lineage[step]
            floor = event.step
            trained_at = _group_steps(lineage)
            restored_groups = {row.group_id for row in event.rows} | set(event.unfinished_groups)
            for group in sorted(restored_groups):
                checked += 1
                if group in trained_at:
                    violations.append(
                        f"group {group} restored by incarnation {event.inc} at step {event.step} "
                        f"but already trained at step {trained_at[group]}"
                    )
        elif isinstance(event, GroupAdmitted):
            if event.group_id in trained_at:
                violations.append(
                    f"group {event.group_id} admitted again by incarnation {event.inc} "
                    f"after being trained at step {trained_at[event.group_id]}"
                )
        elif isinstance(event, StepTrained):
            checked += 1
            if floor is not None and event.step <= floor:
                violations.append(
                    f"step {event.step} trained by incarnation {event.inc} at or below its restored step {floor}"
                )
            elif event.step in lineage:
                violations.append(f"step {event.step} trained twice on one lineage (incarnation {event.inc})")
            else:
                lineage[event.step] = (event.inc, index, list(event.group_ids))
                accepted.add(index)
                for group in event.group_ids:
                    trained_at.setdefault(group, event.step)
    first_step: dict[str, int] = {}
    for step in sorted(lineage):
        for group in lineage[step][2]:
            if group in first_step:
                violations.append(f"group {group} trained twice on one lineage: steps {first_step[group]} and {step}")
            else:
                first_step[group] = step
    return _LineageWalk(lineage, accepted, violations, checked)


def _group_steps(lineage: dict[int, tuple[int, int, list[str]]]) -> dict[str, int]:
    return {group: step for step, (_, _, groups) in sorted(lineage.items()) for group in groups}


def _invariant_1(events: list, walk: _LineageWalk) -> InvariantResult:
    violations = list(walk.violations)
    checked = walk.checked
    final_lineage_indices = {index for _, index, _ in walk.lineage.values()}
    restores = [i for i, e in enumerate(events) if isinstance(e, Restored)]
    last_inc = max((e.inc for e in events), default=0)
    ended_cleanly = any(isinstance(e, RunEnded) and e.inc == last_inc for e in events)
    unverifiable = 0
    for position, start in enumerate(restores):
        restored = events[start]
        if restored.source == SourceKind.FRESH:
            continue
        end = restores[position + 1] if position + 1 < len(restores) else len(events)
        following = events[end] if end < len(events) else None
        missing = _unaccounted_rows(events, start, end, following, walk.accepted, final_lineage_indices)
        checked += len({(row.group_id, row.sibling) for row in restored.rows})
        if following is None and not ended_cleanly:
            # Killed with no later restore to carry the rows on: nothing says where they went.
            unverifiable += len(missing)
            continue
        for group, sibling in missing:
            violations.append(
                f"row {group}/{sibling} restored by incarnation {restored.inc} at step {restored.step} "
                "was lost (never trained on the lineage, discarded, restored again or left outstanding)"
            )
    note = f"run ended by a kill: {unverifiable} rows unverifiable" if unverifiable else ""
    return InvariantResult(1, "no group trained twice, lost or readmitted", not violations, checked, violations, note)


def _unaccounted_rows(
    events: list, start: int, end: int, following: Restored | None, accepted: set[int], final: set[int],
) -> list[tuple[str, int]]:
    """Rows of `events[start]` that between it and the next restore were neither trained on a
    step that survives, discarded, carried into the next restore, nor left outstanding."""
    trained: set[str] = set()
    discarded: set[str] = set()
    outstanding: set[str] = set()
    for index in range(start + 1, end):
        event = events[index]
        if isinstance(event, StepTrained):
            survives = index in final if following is None else (index in accepted and event.step <= following.step)
            if survives:
                trained.update(event.group_ids)
        elif isinstance(event, GroupsDiscarded):
            discarded.update(event.group_ids)
        elif isinstance(event, GroupRerun):
            discarded.add(event.group_id)  # its level (or its judge) gave the group's sealed rows up on purpose
        elif isinstance(event, RunEnded):
            outstanding.update(event.outstanding_groups)
    carried = {(row.group_id, row.sibling) for row in following.rows} if following is not None else set()
    rows = sorted({(row.group_id, row.sibling) for row in events[start].rows})
    return [
        (group, sibling) for group, sibling in rows
        if group not in trained and group not in discarded and (group, sibling) not in carried
        and (following is not None or group not in outstanding)
    ]


# ---- invariant 2: a restored sibling resumes at exactly its saved turn ----


def _invariant_2(events: list, counts: AuditCounts) -> InvariantResult:
    # (incarnation, rollout id) -> its events: attempt N+1 can exist again in a later incarnation
    # that restored the same snapshot, so a continuation is judged only within its own incarnation.
    by_rollout: dict[tuple[int, str], list] = defaultdict(list)
    for event in events:
        if isinstance(event, (SiblingStarted, TurnCommitted, SiblingSealed)):
            by_rollout[(event.inc, event.rollout_id)].append(event)
    violations: list[str] = []
    restored = resumed = sealed = never_sealed = 0
    for event in events:
        if not isinstance(event, Restored):
            continue
        for c in event.continuations:
            restored += 1
            own = by_rollout.get((event.inc, c.next_rollout_id), [])
            resumed += bool(own)
            never_sealed += not any(isinstance(e, SiblingSealed) for e in own)
            for e in own:
                problem = _continuation_problem(c, e)
                if problem:
                    violations.append(f"{problem} (incarnation {event.inc})")
                elif isinstance(e, SiblingSealed):
                    sealed += 1
    counts.continuations_restored, counts.continuations_resumed, counts.continuations_sealed = restored, resumed, sealed
    note = f"{never_sealed} continuations never sealed (killed again or failed)" if never_sealed else ""
    return InvariantResult(2, "restored siblings resume at their saved turn", not violations, restored,
                           violations, note)


def _continuation_problem(c: ContinuationRef, e: SiblingStarted | TurnCommitted | SiblingSealed) -> str | None:
    if isinstance(e, TurnCommitted) and e.turn <= c.turn_index:
        return (f"{c.next_rollout_id} committed turn {e.turn} again: {c.rollout_id} was saved after "
                f"turn {c.turn_index}")
    if isinstance(e, SiblingStarted) and (e.resumed_from, e.resumed_turn) != (c.rollout_id, c.turn_index):
        return (f"{c.next_rollout_id} started from {e.resumed_from} at turn {e.resumed_turn}, "
                f"expected {c.rollout_id} at turn {c.turn_index}")
    if isinstance(e, SiblingSealed) and (e.prefix_sha, e.resumed_turn) != (c.boundary_sha, c.turn_index):
        return (f"{c.next_rollout_id} sealed with prefix {e.prefix_sha} after {e.resumed_turn} turns; "
                f"the saved boundary was {c.boundary_sha} after {c.turn_index} turns")
    return None


# ---- invariant 3: the newest published snapshot survives every crash ----


def _invariant_3(events: list, problems: Sequence[str], snapshot_checks: int) -> InvariantResult:
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


# ---- invariant 4: holds released on every exit path ----


def _invariant_4(events: list, stall_after_s: float = STALL_AFTER_RESTORE_S) -> InvariantResult:
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


# ---- invariant 5: no deadline runs while parked ----


def _invariant_5(events: list) -> InvariantResult:
    expired = [e for e in events if isinstance(e, DeadlineExpired)]
    violations = [
        f"{e.rollout_id} timed out after {e.running_s:.2f}s of its {e.budget_s:.2f}s budget (incarnation {e.inc})"
        for e in expired if e.running_s < e.budget_s - DEADLINE_SLACK_S
    ]
    return InvariantResult(5, "no deadline ran while parked", not violations, len(expired), violations)


# ---- figures ----


def _fill_counts(events: list, walk: _LineageWalk, counts: AuditCounts) -> None:
    counts.incarnations = len({e.inc for e in events})
    counts.restores_by_source = dict(Counter(str(e.source) for e in events if isinstance(e, Restored)))
    counts.steps_trained = len(walk.lineage)
    counts.groups_trained = len({g for _, _, groups in walk.lineage.values() for g in groups})
    turns = [e for e in events if isinstance(e, TurnCommitted)]
    counts.turns_committed = len(turns)
    counts.tokens_generated = sum(e.tokens for e in turns)
    counts.tokens_regenerated = _tokens_regenerated(events, turns)
    counts.restart_to_first_generation_s = _restart_to_first_generation(events, turns)


def _tokens_regenerated(events: list, turns: Iterable[TurnCommitted]) -> int:
    """Tokens of turns that a later restore went back before: generated after the restored
    cut by an earlier incarnation (all of them when the restore is a fresh start). Each turn
    counts once, however many restores go back past it."""
    live = list(turns)
    regenerated = 0
    for event in events:
        if not isinstance(event, Restored):
            continue
        lost = [
            turn for turn in live
            if turn.inc < event.inc and (event.cut_unix_s is None or turn.t > event.cut_unix_s)
        ]
        regenerated += sum(turn.tokens for turn in lost)
        lost_ids = {id(turn) for turn in lost}
        live = [turn for turn in live if id(turn) not in lost_ids]
    return regenerated


def _restart_to_first_generation(events: list, turns: Iterable[TurnCommitted]) -> dict[int, float | None]:
    first_turn: dict[int, float] = {}
    for turn in turns:
        first_turn[turn.inc] = min(first_turn.get(turn.inc, turn.t), turn.t)
    return {
        e.inc: (round(first_turn[e.inc] - e.t, 3) if e.inc in first_turn else None)
        for e in events if isinstance(e, RunStarted) and e.resumed
    }
