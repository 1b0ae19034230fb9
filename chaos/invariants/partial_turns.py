"""Invariant 2 at the `token` level: a turn a crash cut mid-generation goes on from every token its
environment server's turn journal had made durable, never generating one of them again.

The server audits a partial turn's tokens only after they are durable (`turn_tokens`, durable), so the
audit log never claims more than the journal held; a kill may lose such a line, which only makes the
check weaker, never wrong. A restore owes those tokens when it continues that attempt after exactly
that turn and its lineage holds the policy that generated them (a rolled-back policy's tokens are
dropped with it).
"""

from __future__ import annotations

from turnkeep.chaos.invariants.continuations import JournalLineage
from turnkeep.chaos.invariants.results import InvariantResult
from turnkeep.schemas.audit import TurnTokens

NAME = "a cut turn continues from its journaled tokens"


def cut_turns_keep_their_tokens(events: list) -> InvariantResult:
    """An item is one continuation of a turn that had durable tokens of the restored lineage."""
    if not any(isinstance(e, TurnTokens) and e.durable for e in events):
        return InvariantResult(2, NAME, True, 0, note="no turn's tokens were journaled (the level is not 'token')")
    durable: dict[tuple[str, int, int], tuple[int, int]] = {}  # (rollout id, incarnation, turn) -> (tokens, version)
    lineage = JournalLineage(events)
    violations: list[str] = []
    checked = kept = 0
    for event in events:
        if isinstance(event, TurnTokens):
            if not event.durable:
                continue
            key = (event.rollout_id, event.started_by, event.turn)
            tokens, version = durable.get(key, (0, 0))
            durable[key] = (max(tokens, event.tokens), max(version, event.policy_version))
            continue
        newest = lineage.see(event)
        if newest is None:
            continue
        for c in event.continuations:
            tokens, version = durable.get((c.rollout_id, c.started_by, c.turn_index), (0, 0))
            if tokens == 0 or version > newest:
                continue
            checked += 1
            kept += c.partial_tokens
            if c.partial_tokens < tokens:
                violations.append(
                    f"{c.next_rollout_id} continues {c.rollout_id} after turn {c.turn_index} with "
                    f"{c.partial_tokens} tokens of its cut turn, but {tokens} were durable in the turn journal "
                    f"(incarnation {event.inc} generates {tokens - c.partial_tokens} of them again)")
    note = f"{kept} journaled tokens of cut turns kept" if checked else ""
    return InvariantResult(2, NAME, not violations, checked, violations, note)
