"""Receipts whose rows are stored but whose ACK has not reached the environment server yet.

A receipt is added under the data-plane barrier, together with its row, and the ACK
goes out after the barrier opens: nothing under the barrier waits on the network, so a
slow or hung server never holds up a cut or a trainer step. A flush (gym.prepare) is
then: pass the barrier once (rows being stored are added), and wait here until the set
is empty. The cut checks that it is: a prepared server has no unACKed result, so an
ACK still in flight at the cut means a row the server may also save.
"""

from __future__ import annotations

import asyncio


class PendingAcks:
    def __init__(self) -> None:
        self._receipts: set[str] = set()
        self._empty = asyncio.Event()
        self._empty.set()

    def add(self, receipt: str) -> None:
        self._receipts.add(receipt)
        self._empty.clear()

    def done(self, receipt: str) -> None:
        """The ACK was answered, or gave up (the server expires a result nobody ACKs)."""
        self._receipts.discard(receipt)
        if not self._receipts:
            self._empty.set()

    def receipts(self) -> list[str]:
        return sorted(self._receipts)

    async def drained(self, timeout_s: float) -> list[str]:
        """Wait until every ACK is answered; the receipts still pending after `timeout_s` (empty when drained)."""
        try:
            await asyncio.wait_for(self._empty.wait(), timeout=max(timeout_s, 0.0))
        except asyncio.TimeoutError:
            pass
        return self.receipts()
