"""Finished rollout results kept until the controller ACKs their receipt.

Until the ACK the environment server still owns the result: a controller that crashed
before storing the row can fetch it again, and a snapshot is not ready while any
result is unACKed.
"""

from __future__ import annotations

import uuid

from schemas.rollout import RolloutResult


class ReceiptBook:
    def __init__(self) -> None:
        self._pending: dict[str, RolloutResult] = {}

    def issue(self, result: RolloutResult) -> RolloutResult:
        receipt = f"{result.rollout_id}:{uuid.uuid4().hex[:12]}"
        issued = result.model_copy(update={"receipt": receipt})
        self._pending[receipt] = issued
        return issued

    def ack(self, receipt: str) -> bool:
        """Idempotent: ACKing twice is fine; returns whether it was pending."""
        return self._pending.pop(receipt, None) is not None

    def unacked(self) -> int:
        return len(self._pending)

    def discard_all(self) -> int:
        """Drop every pending result (the controller stopped for good); returns how many."""
        count = len(self._pending)
        self._pending.clear()
        return count
