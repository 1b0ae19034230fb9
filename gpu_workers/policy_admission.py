"""The policy server's admission gate and drain.

A completion call is *accepted* only while the gate's hold set is empty; until then
it waits at the gate (it is not refused, so agents need no retry logic). Holders are
named reasons to pause (`refit`, `snapshot:<checkpoint_id>`), so a refit and a
snapshot can overlap and each reopens only its own hold.

`drain` waits for the calls accepted before it started. With admission closed that
means "nothing runs in the engine any more": the precondition for both a weight
load (every response's tokens then come from one policy version) and a snapshot.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from turnkeep.primitives.holds import HoldSet


class AdmissionGate:
    """Gate plus the registry of accepted calls that `drain` waits for."""

    def __init__(self) -> None:
        self.holds = HoldSet("policy-admission")
        self._running: dict[int, asyncio.Future[None]] = {}
        self._ids = itertools.count()
        self._waiting = 0

    def close(self, holder: str, lease_s: float | None = None) -> bool:
        """Stop accepting new calls until `holder` is released; True if newly added."""
        return self.holds.add(holder, lease_s=lease_s)

    def open(self, holder: str) -> bool:
        """Release `holder`; calls flow again once no holder is left."""
        return self.holds.release(holder)

    def is_open(self) -> bool:
        return self.holds.is_clear()

    def holders(self) -> list[str]:
        return sorted(self.holds.holders())

    def inflight(self) -> int:
        """Accepted calls that have not finished."""
        return len(self._running)

    def waiting(self) -> int:
        """Calls waiting at the closed gate (not accepted yet, nothing started)."""
        return self._waiting

    @asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Wait at the gate, then run the body as one accepted call."""
        # wait_clear returns after the set emptied, but another holder may have
        # arrived before this task resumed: check again with no await in between,
        # so acceptance and the registration below are atomic on the loop.
        self._waiting += 1
        try:
            while not self.holds.is_clear():
                await self.holds.wait_clear()
        finally:
            self._waiting -= 1
        call_id = next(self._ids)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._running[call_id] = done
        try:
            yield
        finally:
            del self._running[call_id]
            done.set_result(None)

    async def drain(self, timeout_s: float | None = None) -> int:
        """Wait until every call accepted so far has finished; return how many that was.

        Raises TimeoutError (naming how many still run) if they do not finish in time.
        """
        pending = list(self._running.values())
        if not pending:
            return 0
        _, not_done = await asyncio.wait(pending, timeout=timeout_s)
        if not_done:
            raise TimeoutError(f"{len(not_done)} of {len(pending)} accepted calls still running after {timeout_s}s")
        return len(pending)
