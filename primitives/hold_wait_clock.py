"""How long a guarded action waited on each holder of its hold set.

The trainer's optimizer step waits on the trainer hold; an attempt that took the hold
reports, when it releases it, how long the step waited on it (the attempt's
`trainer_wait_s`). The wait counts from the later of "the step started waiting" and
"the holder was added".
"""

from __future__ import annotations

import time


class HoldWaitClock:
    def __init__(self) -> None:
        self.waiting_since: float | None = None
        self.added_at: dict[str, float] = {}

    def waited_on(self, holder: str) -> float:
        added = self.added_at.pop(holder, None)
        if self.waiting_since is None or added is None:
            return 0.0
        return time.monotonic() - max(self.waiting_since, added)
