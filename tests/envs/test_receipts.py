"""Unacknowledged results: kept until ACKed, named in a readiness report, expired after their lease."""

from __future__ import annotations

from turnkeep.envs.receipts import ReceiptBook
from turnkeep.schemas.rollout import RolloutOutcome, RolloutResult


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def result(rollout_id: str) -> RolloutResult:
    return RolloutResult(rollout_id=rollout_id, outcome=RolloutOutcome.FAILED, reason="test")


def test_an_unacked_result_blocks_until_acked_or_expired(caplog) -> None:
    clock = Clock()
    book = ReceiptBook(lease_s=30, clock=clock)
    kept = book.issue(result("g.0.0"))
    forgotten = book.issue(result("g.1.0"))
    clock.now += 2.5
    assert book.unacked() == 2
    assert "rollout g.0.0 (unACKed 2.5 s)" in book.waiting_on()
    assert book.ack(kept.receipt) and not book.ack(kept.receipt)
    clock.now += 27.5
    assert book.unacked() == 0 and book.expired == 1
    assert "g.1.0" in caplog.text and "expired" in caplog.text
    assert not book.ack(forgotten.receipt)
