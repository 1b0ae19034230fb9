"""Check DESIGN.md's invariants 1 to 5 and 7 after the fact, from a run's `audit.jsonl`.

`turnkeep chaos` kills a run many times and then calls `check_run_dir`; tests call
`check_invariants` on event lists they build. The checker trusts nothing the controller
says about itself except the events: every verdict is derived from what was admitted,
sealed, cut, trained, restored, resumed, held and released, in file order, and compared
with what the controller saved or reported. The checks live in `chaos/invariants/`,
one module per family; this module runs them all and keeps the names callers import.

A log written before some events existed (`cut_taken`, `hold_changed`) gets "not checked"
for the checks that need them, never a failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from turnkeep.chaos.invariants.continuations import invariant_2, journaled_agents_were_committed, saved_agents_continued
from turnkeep.chaos.invariants.deadlines import DEADLINE_SLACK_S, invariant_5
from turnkeep.chaos.invariants.engine_tokens import fill_engine_counts, read_tallies
from turnkeep.chaos.invariants.figures import fill_counts
from turnkeep.chaos.invariants.holds import STALL_AFTER_RESTORE_S, hold_spans, holds_within_lease, invariant_4
from turnkeep.chaos.invariants.lineage import invariant_1, walk_lineage
from turnkeep.chaos.invariants.live_state import invariant_7
from turnkeep.chaos.invariants.partial_turns import cut_turns_keep_their_tokens
from turnkeep.chaos.invariants.results import MAX_LISTED_VIOLATIONS, AuditCounts, InvariantResult, Verdict
from turnkeep.chaos.invariants.running_agents import running_agents_continued
from turnkeep.chaos.invariants.snapshots import invariant_3
from turnkeep.primitives.audit_log import read_audit

__all__ = [
    "DEADLINE_SLACK_S", "MAX_LISTED_VIOLATIONS", "STALL_AFTER_RESTORE_S", "AuditCounts", "InvariantResult", "Verdict",
    "check_invariants", "check_run_dir",
]


def check_run_dir(run_dir: Path, *, newest_snapshot_problems: Sequence[str] = (), snapshot_checks: int = 0) -> Verdict:
    return check_invariants(
        list(read_audit(run_dir)), newest_snapshot_problems=newest_snapshot_problems, snapshot_checks=snapshot_checks,
        engine_tallies=read_tallies(run_dir),
    )


def check_invariants(
    events: list, *, newest_snapshot_problems: Sequence[str] = (), snapshot_checks: int = 0,
    engine_tallies: dict[int, int] | None = None,
) -> Verdict:
    """`newest_snapshot_problems`: what the chaos command found wrong with the newest published
    snapshot after its kills; `snapshot_checks`: how many such checks it made (for the table); `engine_tallies`:
    the engines' own token counts per incarnation (`chaos.invariants.engine_tokens.read_tallies`).

    One row per check, in invariant order; an invariant may have several."""
    walk = walk_lineage(events)
    spans = hold_spans(events)
    counts = AuditCounts()
    results = [
        invariant_1(events, walk),
        invariant_2(events, counts),
        saved_agents_continued(events),
        journaled_agents_were_committed(events),
        cut_turns_keep_their_tokens(events),
        running_agents_continued(events, counts),
        invariant_3(events, newest_snapshot_problems, snapshot_checks),
        invariant_4(events),
        holds_within_lease(events, spans),
        invariant_5(events, spans),
        *invariant_7(events),
    ]
    fill_counts(events, walk, counts)
    fill_engine_counts(events, engine_tallies or {}, counts)
    return Verdict(results, counts)
