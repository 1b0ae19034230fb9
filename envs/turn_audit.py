"""The environment server's audit lines about turns: each committed turn, and a streaming turn's progress."""

from __future__ import annotations

from turnkeep.envs.turn_journal import PartialDurable
from turnkeep.primitives.audit_log import AuditLog
from turnkeep.schemas.audit import TurnCommitted, TurnTokens
from turnkeep.schemas.rollout import RolloutRequest, Segment


def audit_turn(audit: AuditLog | None, request: RolloutRequest, turn: int, segment: Segment, carried: int) -> None:
    if audit is not None:
        audit.emit(
            TurnCommitted, rollout_id=request.rollout_id, group_id=request.group_id, sibling=request.sibling,
            attempt=request.attempt, turn=turn, policy_version=segment.policy_version or 0,
            tokens=len(segment.token_ids), carried=carried, started_by=request.incarnation,
        )


def audit_chunk(audit: AuditLog | None, request: RolloutRequest, turn: int, tokens: int, version: int) -> None:
    """Tokens of a turn streamed so far: what a kill right now would cut (the chaos figures)."""
    if audit is not None:
        audit.emit(TurnTokens, rollout_id=request.rollout_id, turn=turn, tokens=tokens, policy_version=version,
                   started_by=request.incarnation)


def audit_tokens_durable(audit: AuditLog | None, durable: list[PartialDurable]) -> None:
    """After the journal's sync: the checker holds a restore to at least these tokens of each cut turn."""
    if audit is not None:
        for partial in durable:
            audit.emit(TurnTokens, **partial._asdict(), durable=True)
