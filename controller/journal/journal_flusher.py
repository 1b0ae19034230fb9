"""Records no writer waits on, made durable within a short interval anyway.

A row's record is durable before its ACK, and a cut or a checkpoint syncs the journal, but an
admission, a dataloader move or a train step's record waits in memory for the next of those. A
kill in between loses them: the restore then knows neither the groups admitted meanwhile (so
the turns their agents committed cannot continue) nor the train steps taken (so turns of those
policies cannot either). Flushing what is pending every `JOURNAL_FLUSH_S` bounds that window
by time instead of by the next seal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from turnkeep.controller.journal.state_journal import JournalHooks
from turnkeep.primitives.audit_log import describe_error

log = logging.getLogger("turnkeep.journal")

JOURNAL_FLUSH_S = 0.05
"""As often as the environment servers flush their turn journals (`env.journal_flush_s`)."""


async def flush_journal_forever(current: Callable[[], JournalHooks], interval_s: float = JOURNAL_FLUSH_S) -> None:
    """Flush the journal `current()` returns (a restore may start a new one) every `interval_s`, until cancelled.
    A failed write is reported once per streak; the records stay buffered, and the writers that wait on them get
    the error themselves."""
    failing = False
    while True:
        await asyncio.sleep(interval_s)
        try:
            await current().flush_pending()
        except Exception as err:  # noqa: BLE001 - reported here; the run's own writers raise it where it matters
            if not failing:
                log.warning("the controller journal could not be flushed (%s); retrying every %.2fs",
                            describe_error(err), interval_s)
            failing = True
        else:
            if failing:
                log.info("the controller journal is being written again")
            failing = False
