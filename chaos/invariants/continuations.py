"""Invariant 2: a restored sibling continues from exactly the turn it was saved at, and every
saved agent a restore brings back is continued (or, where its level says so, rerun).

`invariant_2` judges the continuation's own events; `saved_agents_continued` looks for the
events that should exist and do not: a saved agent whose attempt N+1 never started while the
incarnation went on running, or one the restore dropped between its cut and itself.
"""

from __future__ import annotations

from collections import defaultdict

from turnkeep.chaos.invariants.results import AuditCounts, InvariantResult, joined
from turnkeep.chaos.invariants.timeline import (
    RUN_START,
    after_restores,
    attempt_after,
    cut_of,
    cuts_by_time,
    group_of,
    restored_nothing,
)
from turnkeep.schemas.audit import (
    ContinuationRef,
    CutTaken,
    GroupDropped,
    GroupRerun,
    Restored,
    RunEnded,
    SiblingSealed,
    SiblingStarted,
    StepTrained,
    TurnCommitted,
    ids_digest,
)
from turnkeep.schemas.choices import AgentsFrom

CONTINUE_GRACE_S = 5.0
"""Restored siblings all start the moment admission opens; an incarnation that lived this long
after its first start without starting one of them never will."""


def invariant_2(events: list, counts: AuditCounts) -> InvariantResult:
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


def saved_agents_continued(events: list, grace_s: float = CONTINUE_GRACE_S) -> InvariantResult:
    """Each saved agent of each restore (continued, or rerun by its level) has its attempt N+1 started
    in that incarnation, unless its group was given up whole; and a restore brings back exactly the
    saved agents its cut checked (`cut_taken`). An item is one saved agent or one restore matched to its cut."""
    cuts = cuts_by_time(events)
    violations: list[str] = []
    checked = unverifiable = unmatched = 0
    unstarted: tuple[Restored, list[str]] | None = None
    """The previous restore and its agents killed before they started: a restore of the same cut owes them."""
    for restored, following in after_restores(events):
        agents = [c.rollout_id for c in restored.continuations] + list(restored.agents_not_continued)
        if unstarted is not None and _same_cut(unstarted[0], restored):
            checked += len(unstarted[1])
            violations += [f"saved agent {agent} restored by incarnation {unstarted[0].inc} was killed before it "
                           f"started, and incarnation {restored.inc} restored the same cut without it"
                           for agent in unstarted[1] if agent not in agents]
        unstarted = (restored, [])
        if restored_nothing(restored):
            continue
        cut = cut_of(restored, cuts)
        if restored.agents_from == AgentsFrom.JOURNAL:
            pass  # its agents come from the turn journals, not the cut: `journaled_agents_were_committed` checks them
        elif cut is None:
            unmatched += 1
        else:
            checked += 1
            problem = _agents_against_cut(restored, agents, cut)
            if problem:
                violations.append(problem)
        started = {e.rollout_id for e in following if isinstance(e, SiblingStarted)}
        first_start = min((e.t for e in following if isinstance(e, SiblingStarted)), default=None)
        given_up = _groups_given_up(following)
        ended = any(isinstance(e, RunEnded) for e in following)
        lived_until = max((e.t for e in following), default=restored.t)
        for agent in agents:
            checked += 1
            if attempt_after(agent) in started or group_of(agent) in given_up:
                continue
            if first_start is None or not (ended or lived_until >= first_start + grace_s):
                unverifiable += 1  # killed before (or as) its restored siblings started
                if first_start is None:
                    unstarted[1].append(agent)
                continue
            violations.append(
                f"saved agent {agent} restored by incarnation {restored.inc} at step {restored.step} was never "
                f"continued: {attempt_after(agent)} never started, though the incarnation started others and "
                f"{'ended cleanly' if ended else f'lived {lived_until - first_start:.0f}s longer'}"
            )
    notes = [f"{unverifiable} saved agents unverifiable (killed before their siblings started)" if unverifiable
             else ""]
    if unmatched and not any(isinstance(event, CutTaken) for event in events):
        notes.append("restores not compared with their cuts: no cut_taken events in this log")
    elif unmatched:
        notes.append(f"{unmatched} restores whose cut is not in the log")
    return InvariantResult(2, "every saved agent continued or rerun", not violations, checked, violations,
                           joined(*notes))


def _same_cut(earlier: Restored, later: Restored) -> bool:
    return (later.source == earlier.source and later.step == earlier.step
            and later.cut_unix_s == earlier.cut_unix_s and later.snapshot_dir == earlier.snapshot_dir)


def journaled_agents_were_committed(events: list) -> InvariantResult:
    """Each agent a restore continued from a turn journal continues a boundary its attempt really committed (a
    `turn_committed` at that turn), and none of the turns up to it came from a policy outside the restored
    lineage: the cut's policy, or, when the restore kept the journal past its cut, the policies the cut's
    incarnation trained after it (read from its `step_trained` lines, not from the restore's word). The turn
    journal may hold turns of a policy the restore rolled back; those must never be continued. An item is one
    continued agent."""
    committed = committed_turns(events)
    lineage = JournalLineage(events)
    violations: list[str] = []
    checked = unverifiable = 0
    for event in events:
        newest = lineage.see(event)
        if newest is not None:
            if event.kept_after_cut is not None and event.kept_after_cut.newest_policy_version > newest:
                violations.append(
                    f"restore of incarnation {event.inc} says it kept policy version "
                    f"{event.kept_after_cut.newest_policy_version}, but its cut's incarnation trained up to {newest}")
            for c in event.continuations:
                turns = committed.get((c.rollout_id, c.started_by), {})
                if c.turn_index > 0 and c.turn_index not in turns:  # turn 0: the prompt, committed by nobody
                    unverifiable += 1  # its commit may not have reached the audit log before the kill
                    continue
                checked += 1
                newer = {turn: v for turn, v in turns.items() if turn <= c.turn_index and v > newest}
                if newer:
                    violations.append(
                        f"{c.next_rollout_id} continues {c.rollout_id} after turn {c.turn_index}, but turns "
                        f"{sorted(newer)} came from policy versions {sorted(set(newer.values()))}, newer than the "
                        f"restored lineage's {newest}")
    note = f"{unverifiable} continued agents whose boundary the audit log lacks" if unverifiable else ""
    return InvariantResult(2, "journaled agents continue committed turns of the restored lineage", not violations,
                           checked, violations, note)


def committed_turns(events: list) -> dict[tuple[str, int], dict[int, int]]:
    """(rollout id, incarnation that started it) -> turn -> policy version, ids repeating across lineages. A
    continuation's first turns are its saved attempt's: a restore that continues a continuation (attempt N+2 from
    N+1, which committed only the turns after N's boundary) reaches back along the chain of restores for them."""
    own: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    # (attempt N+1, the restoring incarnation that started it) -> (attempt N, its starter, turns saved)
    saved_from: dict[tuple[str, int], tuple[str, int, int]] = {}
    for event in events:
        if isinstance(event, TurnCommitted):
            own[(event.rollout_id, event.started_by)][event.turn] = event.policy_version
        elif isinstance(event, Restored):
            for c in event.continuations:
                saved_from[(c.next_rollout_id, event.inc)] = (c.rollout_id, c.started_by, c.turn_index)

    def turns_of(key: tuple[str, int], seen: frozenset) -> dict[int, int]:
        turns = dict(own.get(key, {}))
        parent = saved_from.get(key)
        if parent is not None and parent[:2] not in seen:
            earlier = turns_of(parent[:2], seen | {key})
            turns.update({turn: v for turn, v in earlier.items() if turn <= parent[2]})
        return turns

    return {key: turns_of(key, frozenset()) for key in own.keys() | saved_from.keys()}


class JournalLineage:
    """Fed the events in order, says for each restore from the turn journals the newest policy version its
    lineage can hold (what it may continue)."""

    def __init__(self, events: list) -> None:
        self._cuts = cuts_by_time(events)
        self._trained: dict[int, list[tuple[float, int]]] = defaultdict(list)  # incarnation -> (time, version)
        self._went_on: dict[float, list[tuple[int, float]]] = defaultdict(list)  # cut time -> (incarnation, since)

    def see(self, event) -> int | None:
        """The restored lineage's newest policy version for a journal restore; None for any other event."""
        if isinstance(event, StepTrained):
            self._trained[event.inc].append((event.t, event.policy_version))
        elif isinstance(event, Restored) and event.agents_from == AgentsFrom.JOURNAL:
            cut = cut_of(event, self._cuts)
            if cut is not None and event.kept_after_cut is not None:
                self._went_on[cut.cut_unix_s].append((event.inc, event.t))
            return newest_kept_policy(event, cut, self._trained, self._went_on)
        return None


def newest_kept_policy(restored: Restored, cut: CutTaken | None, trained: dict[int, list[tuple[float, int]]],
                        went_on: dict[float, list[tuple[int, float]]]) -> int:
    """The newest policy the restored lineage can hold: trained after the cut by its incarnation, or by one that
    restored the same cut earlier and went on from it."""
    if restored.kept_after_cut is None or cut is None:
        return restored.policy_version
    since = cut.t if cut.cut_unix_s == RUN_START else cut.cut_unix_s
    starts = [(cut.inc, since), *[(inc, t) for inc, t in went_on[cut.cut_unix_s] if inc != restored.inc]]
    after = [version for inc, since in starts for t, version in trained.get(inc, []) if t > since]
    return max([restored.policy_version, *after])


def _agents_against_cut(restored: Restored, agents: list[str], cut: CutTaken) -> str | None:
    if (len(agents), ids_digest(agents)) == (cut.continuations, cut.continuations_digest):
        return None
    if len(agents) < cut.continuations:
        what = f"{cut.continuations - len(agents)} saved agents lost between the cut and the restore"
    elif len(agents) > cut.continuations:
        what = f"{len(agents) - cut.continuations} saved agents the cut never checked"
    else:
        what = "not the same ones"
    return (f"restore of incarnation {restored.inc} brought back {len(agents)} saved agents (continued or rerun); "
            f"its {cut.kind} cut at step {cut.step} checked {cut.continuations}: {what}")


def _groups_given_up(following: list) -> set[str]:
    """Groups rerun whole or dropped: a saved agent of theirs has nothing left to continue. (A group
    cannot be trained or discarded while a restored sibling of it never started: it never settles.)"""
    return {e.group_id for e in following if isinstance(e, (GroupRerun, GroupDropped))}
