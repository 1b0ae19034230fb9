"""Finished rollout results kept until the controller ACKs their receipt.

Until the ACK the environment server still owns the result, and a snapshot is not
ready while any result is unACKed: a result the controller has not stored yet would be
in neither the snapshot's agents nor its data plane. The controller ACKs within
milliseconds of storing a row; a result nobody ACKs for `lease_s` (its controller died,
or a caller that is not a run asked for it) expires with a warning, so it cannot keep
every later snapshot from ever getting ready.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from turnkeep.schemas.rollout import RolloutResult

log = logging.getLogger("turnkeep.env")

RECEIPT_LEASE_S = 30.0


@dataclass(frozen=True)
class _Pending:
    result: RolloutResult
    issued: float


class ReceiptBook:
    def __init__(self, lease_s: float = RECEIPT_LEASE_S, clock=time.monotonic) -> None:
        self._pending: dict[str, _Pending] = {}
        self._lease_s = lease_s
        self._clock = clock
        self.expired = 0

    def issue(self, result: RolloutResult) -> RolloutResult:
        receipt = f"{result.rollout_id}:{uuid.uuid4().hex[:12]}"
        issued = result.model_copy(update={"receipt": receipt})
        self._pending[receipt] = _Pending(issued, self._clock())
        return issued

    def ack(self, receipt: str) -> bool:
        """Idempotent: ACKing twice is fine; returns whether it was pending."""
        return self._pending.pop(receipt, None) is not None

    def unacked(self) -> int:
        self._expire()
        return len(self._pending)

    def waiting_on(self, most: int = 3) -> str:
        """The oldest unACKed results, for a readiness report: `rollout X (unACKed 2.1 s)`."""
        self._expire()
        now = self._clock()
        oldest = sorted(self._pending.values(), key=lambda pending: pending.issued)[:most]
        named = ", ".join(f"rollout {p.result.rollout_id} (unACKed {now - p.issued:.1f} s)" for p in oldest)
        more = len(self._pending) - len(oldest)
        return named + (f" and {more} more" if more > 0 else "")

    def discard_all(self) -> int:
        """Drop every pending result (the controller stopped for good); returns how many."""
        count = len(self._pending)
        self._pending.clear()
        return count

    def _expire(self) -> None:
        deadline = self._clock() - self._lease_s
        for receipt in [r for r, pending in self._pending.items() if pending.issued <= deadline]:
            pending = self._pending.pop(receipt)
            self.expired += 1
            log.warning("the result of rollout %s was not ACKed within %.0f s and expired (its controller is gone, "
                        "or the caller was not a run); it no longer blocks a snapshot", pending.result.rollout_id,
                        self._lease_s)
