"""Invariant 2, from the killed incarnation's side: an agent that was running when it died, with a turn of the
restored lineage committed well before the kill, is continued by the restore that keeps that incarnation's journal.

`saved_agents_continued` and `journaled_agents_were_committed` judge what a restore says it brought back; this
check reads what the killed incarnation really had running, from its own `sibling_started` and `turn_committed`
lines, so a restore that quietly drops agents (reads them as not running, or misses their boundaries) fails it.

Left out, each for a reason the log shows: an agent sealed (its row is among the restore's rows, which include
the seals its kept journal holds past the audit log, or its group was trained by a step the restore kept), an attempt that failed (`sibling_failed`: it ended, and a later
attempt of its sibling took its place, as when its environment server went away under it), one whose group was rerun whole, dropped or discarded, one
the restore names as started over by its level (`agents_not_continued`), one with no turn of the restored lineage,
and turns committed less than `JOURNAL_GRACE_S` before the incarnation's last line (the turn journal's batch may
not have reached the disk before the kill; those turns are generated again and counted as such).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from turnkeep.chaos.invariants.results import AuditCounts, InvariantResult
from turnkeep.chaos.invariants.timeline import last_heard
from turnkeep.schemas.audit import (
    GroupDropped,
    GroupRerun,
    GroupsDiscarded,
    Restored,
    SiblingFailed,
    SiblingSealed,
    SiblingStarted,
    StepTrained,
    TurnCommitted,
)
from turnkeep.schemas.choices import AgentsFrom

JOURNAL_GRACE_S = 0.5
"""An environment server flushes its turn journal every `journal_flush_s` (50 ms), after its audit lines; under a
trainer checkpoint's fsyncs a turn's audit line ran up to 0.22 s ahead of its journal batch in chaos42 (the agents
the restores did not continue all had their first turn within 0.22 s of the kill). A turn committed closer than
this to a kill may be in the audit log and not in the journal. At 0.5 s the check judged 335 agents of chaos42,
at 1 s none: its rollouts last about a second."""

NAME = "agents running at a kill continued"


@dataclass
class _Incarnation:
    """What one incarnation had running, from its own lines."""

    started: dict[str, SiblingStarted] = field(default_factory=dict)
    sealed: set[str] = field(default_factory=set)
    """Attempts that ended: sealed, or failed (a failed attempt is never continued; its sibling's next one runs)."""
    given_up: set[str] = field(default_factory=set)
    turns: dict[str, list[TurnCommitted]] = field(default_factory=dict)
    trained: list[StepTrained] = field(default_factory=list)


def running_agents_continued(events: list, counts: AuditCounts | None = None,
                             grace_s: float = JOURNAL_GRACE_S) -> InvariantResult:
    """An item is one agent a restore owed its killed incarnation."""
    lives = _incarnations(events)
    last = last_heard(events)
    violations: list[str] = []
    checked = owing = 0
    for restored in (e for e in events if isinstance(e, Restored)):
        kept = restored.kept_after_cut
        if restored.agents_from != AgentsFrom.JOURNAL or kept is None or kept.stopped is not None:
            continue  # it brought back exactly its cut (or a damaged journal's part of it): nothing to hold it to
        killed = _journal_incarnation(kept.journal)
        life = lives.get(killed)
        if life is None or killed >= restored.inc:
            continue
        newest = _newest_policy(restored, life)
        owed = _owed(restored, life, newest, last[killed] - grace_s)
        checked += len(owed)
        owing += bool(owed)
        continued = {c.rollout_id for c in restored.continuations}
        violations += [
            f"{agent} was running when incarnation {killed} died, with turn {turn.turn} (policy {turn.policy_version}) "
            f"committed {last[killed] - turn.t:.2f}s before its last line, and incarnation {restored.inc}'s restore "
            "neither continued it nor named it as started over"
            for agent, turn in sorted(owed.items()) if agent not in continued]
    if counts is not None:
        counts.restores_owing_agents = owing
    note = f"{owing} restores had running agents to continue" if owing else ""
    return InvariantResult(2, NAME, not violations, checked, violations, note)


def _incarnations(events: list) -> dict[int, _Incarnation]:
    lives: dict[int, _Incarnation] = {}
    for event in events:
        life = lives.setdefault(event.inc, _Incarnation())
        if isinstance(event, SiblingStarted):
            life.started[event.rollout_id] = event
        elif isinstance(event, (SiblingSealed, SiblingFailed)):
            life.sealed.add(event.rollout_id)
        elif isinstance(event, TurnCommitted):
            life.turns.setdefault(event.rollout_id, []).append(event)
        elif isinstance(event, (GroupRerun, GroupDropped)):
            life.given_up.add(event.group_id)
        elif isinstance(event, GroupsDiscarded):
            life.given_up.update(event.group_ids)
        elif isinstance(event, StepTrained):
            life.trained.append(event)
    return lives


def _journal_incarnation(journal: str) -> int:
    """`journal/inc-000028` -> 28; -1 for a log from before the restore named it."""
    tail = journal.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _newest_policy(restored: Restored, life: _Incarnation) -> int:
    """The newest policy whose turns the restore may continue: the restored one, or one the killed incarnation
    trained after the cut (its steps are undone, its turns kept), read from its own `step_trained` lines."""
    since = restored.cut_unix_s if restored.cut_unix_s is not None else float("-inf")
    return max([restored.policy_version, *(s.policy_version for s in life.trained if s.t > since)])


def _owed(restored: Restored, life: _Incarnation, newest: int, turned_by: float) -> dict[str, TurnCommitted]:
    """Agent -> its first own turn of the restored lineage, for each agent the restore owes."""
    rows = {row.rollout_id for row in restored.rows}
    named = set(restored.agents_not_continued)
    # A kept trainer step trained its groups whole: their rows were stored, though a controller killed before its
    # audit flush left their seal lines out of the log.
    trained = {group for step in (restored.kept_after_cut.kept_steps if restored.kept_after_cut else [])
               for group in step.group_ids}
    owed = {}
    for agent, start in life.started.items():
        if (agent in life.sealed or agent in rows or agent in named or start.group_id in life.given_up
                or start.group_id in trained):
            continue
        first = next((t for t in life.turns.get(agent, []) if t.turn > start.resumed_turn), None)
        if first is not None and first.policy_version <= newest and first.t <= turned_by:
            owed[agent] = first
    return owed
