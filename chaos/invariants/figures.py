"""The run's figures beside the verdict: steps and groups on the final lineage, continuations,
tokens generated and thrown away by crashes, and how soon each restart generated again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from turnkeep.chaos.invariants.lineage import LineageWalk
from turnkeep.chaos.invariants.results import AuditCounts
from turnkeep.schemas.audit import (
    GroupDropped,
    GroupRerun,
    GroupsDiscarded,
    Restored,
    RunEnded,
    RunStarted,
    SiblingFailed,
    SiblingSealed,
    TurnCommitted,
    TurnTokens,
)


def fill_counts(events: list, walk: LineageWalk, counts: AuditCounts) -> None:
    counts.incarnations = len({e.inc for e in events})
    counts.restores_by_source = dict(Counter(str(e.source) for e in events if isinstance(e, Restored)))
    counts.restores_continuing_agents = sum(1 for e in events if isinstance(e, Restored) and e.continuations)
    counts.steps_trained = len(walk.lineage)
    trained = {g for _, _, groups in walk.lineage.values() for g in groups}
    counts.groups_trained = len(trained)
    turns = [e for e in events if isinstance(e, TurnCommitted)]
    counts.turns_committed = len(turns)
    counts.cut_turn_tokens, counts.cut_turn_tokens_kept = cut_turn_tokens(events)
    counts.tokens_generated = sum(e.tokens - e.carried for e in turns) + counts.cut_turn_tokens
    counts.tokens_regenerated = (sum(turn.tokens for turn in turns_committed_again(turns))
                                 + counts.cut_turn_tokens - counts.cut_turn_tokens_kept)
    counts.tokens_discarded = tokens_of_discarded_groups(events, turns, trained)
    counts.restart_to_first_generation_s = _restart_to_first_generation(events, turns)


def turns_committed_again(turns: Iterable[TurnCommitted]) -> list[TurnCommitted]:
    """Turns a later incarnation generated again: the same turn of the same sibling (group, sibling,
    turn index) committed again after a restart. Read from the turns alone, not from what a restore says it kept:
    a continuation from a boundary past the cut keeps its turns, and a turn committed by every incarnation that
    went back past it counts once per incarnation that threw it away. A turn generated twice within one
    incarnation (a live failure's rerun) is not a crash's loss and is not counted."""
    turns = list(turns)
    newest: dict[tuple[str, int, int], int] = {}
    for turn in turns:
        key = (turn.group_id, turn.sibling, turn.turn)
        newest[key] = max(newest.get(key, turn.inc), turn.inc)
    return [turn for turn in turns if newest[(turn.group_id, turn.sibling, turn.turn)] > turn.inc]


def cut_turn_tokens(events: list) -> tuple[int, int]:
    """(tokens streamed in turns a kill cut, tokens of them a continuation kept), over every incarnation
    (`streamed_by_incarnation`)."""
    per_inc = streamed_by_incarnation(events).values()
    return sum(one.cut for one in per_inc), sum(one.kept for one in per_inc)


@dataclass
class Streamed:
    """One incarnation's streamed turns that it did not commit, as the audit's progress reports saw them."""
    cut: int = 0
    """Tokens of turns a kill cut: streamed, and the incarnation ended (killed) before the attempt committed the
    turn, sealed, failed or its group was given up."""
    kept: int = 0
    """Of those, tokens a continuation went on from (`partial_tokens`, the `token` level)."""
    uncommitted: int = 0
    """Tokens of every streamed turn it did not commit: the cut ones, and those settled otherwise."""


def streamed_by_incarnation(events: list) -> dict[int, Streamed]:
    """Per incarnation, what `Streamed` holds. A turn is cut when the attempt streamed some of it (`turn_tokens`)
    and its incarnation ended without a `run_ended` before the attempt settled; a continuation keeps the tokens it
    says it went on from, the rest are generated again. An attempt whose row the next restore holds sealed before
    the kill, whatever the audit log had not yet written when it died (its lines are flushed in batches, the
    controller's state journal first): its turns are in that row, not lost."""
    ended = {e.inc for e in events if isinstance(e, RunEnded)}
    sealed_before_kill = _rows_of_the_next_restore(events)
    streamed: dict[tuple[int, str, int, int], int] = {}  # (incarnation, rollout id, started by, turn) -> tokens
    committed: set[tuple[int, str, int]] = set()  # (incarnation, rollout id, turn)
    settled: set[tuple[int, str, int]] = set()  # (incarnation, rollout id, -1): the attempt ended
    given_up: set[tuple[int, str]] = set()  # (incarnation, group id)
    kept: dict[tuple[str, int, int], int] = {}  # (rollout id, started by, turn) -> tokens a continuation kept
    for e in events:
        if isinstance(e, TurnTokens):
            key = (e.inc, e.rollout_id, e.started_by, e.turn)
            streamed[key] = max(streamed.get(key, 0), e.tokens)
        elif isinstance(e, TurnCommitted):
            committed.add((e.inc, e.rollout_id, e.turn - 1))
        elif isinstance(e, (SiblingSealed, SiblingFailed)):
            settled.add((e.inc, e.rollout_id, -1))
        elif isinstance(e, GroupsDiscarded):
            given_up.update((e.inc, gid) for gid in e.group_ids)
        elif isinstance(e, (GroupRerun, GroupDropped)):
            given_up.add((e.inc, e.group_id))
        elif isinstance(e, Restored):
            for c in e.continuations:
                key = (c.rollout_id, c.started_by, c.turn_index)
                kept[key] = max(kept.get(key, 0), c.partial_tokens)
    found: dict[int, Streamed] = {}
    for (inc, rollout_id, started_by, turn), tokens in streamed.items():
        if (inc, rollout_id, turn) in committed:
            continue
        one = found.setdefault(inc, Streamed())
        one.uncommitted += tokens
        if (inc in ended or (inc, rollout_id, -1) in settled or (inc, rollout_id.rsplit(".", 2)[0]) in given_up
                or (inc, rollout_id) in sealed_before_kill):
            continue
        one.cut += tokens
        one.kept += min(tokens, kept.get((rollout_id, started_by, turn), 0))
    return found


def _rows_of_the_next_restore(events: list) -> set[tuple[int, str]]:
    """(incarnation, rollout id) of every row that the first restore after that incarnation holds."""
    restores = sorted((e for e in events if isinstance(e, Restored)), key=lambda e: e.inc)
    found: set[tuple[int, str]] = set()
    for inc in {e.inc for e in events}:
        following = next((r for r in restores if r.inc > inc), None)
        if following is not None:
            found.update((inc, row.rollout_id) for row in following.rows)
    return found


def tokens_of_discarded_groups(events: list, turns: list[TurnCommitted], trained: set[str]) -> dict[str, int]:
    """Tokens of every turn of the groups discarded (by the reason of their first discard) and never trained on the
    final lineage: generated and thrown away whole, by the staleness bound or for too few siblings. A group a
    restore brought back from before its discard and trained after all counts nothing."""
    reasons: dict[str, str] = {}
    for event in events:
        if isinstance(event, GroupsDiscarded):
            for group_id in event.group_ids:
                reasons.setdefault(group_id, event.reason)
    tokens: Counter[str] = Counter()
    for turn in turns:
        if turn.group_id in reasons and turn.group_id not in trained:
            tokens[reasons[turn.group_id]] += turn.tokens
    return dict(sorted(tokens.items()))


def _restart_to_first_generation(events: list, turns: Iterable[TurnCommitted]) -> dict[int, float | None]:
    first_turn: dict[int, float] = {}
    for turn in turns:
        first_turn[turn.inc] = min(first_turn.get(turn.inc, turn.t), turn.t)
    return {
        e.inc: (round(first_turn[e.inc] - e.t, 3) if e.inc in first_turn else None)
        for e in events if isinstance(e, RunStarted) and e.resumed
    }
