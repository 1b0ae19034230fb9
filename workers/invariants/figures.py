"""The run's figures beside the verdict: steps and groups on the final lineage, continuations,
tokens generated and thrown away by crashes, and how soon each restart generated again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from schemas.audit import Restored, RunStarted, TurnCommitted
from workers.invariants.lineage import LineageWalk
from workers.invariants.results import AuditCounts


def fill_counts(events: list, walk: LineageWalk, counts: AuditCounts) -> None:
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
