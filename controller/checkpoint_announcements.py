"""Where the train pump's trainer checkpoints are announced.

The controller is built before the run workflow that takes the announcements exists (that workflow's activities
work on the controller), so the controller is built with this object, and the controller's Temporal worker
(`workers.temporal.controller_worker`) connects the workflow to it once the workflow runs. Until then, and in a run
with snapshots off, an announcement reaches nobody.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

CheckpointListener = Callable[[int, str, bool], Awaitable[None]]
"""Called with the checkpoint's step, its trigger, and whether it was announced before."""


class CheckpointAnnouncements:
    def __init__(self) -> None:
        self._listener: CheckpointListener | None = None

    def connect(self, listener: CheckpointListener) -> None:
        self._listener = listener

    async def announce(self, step: int, trigger: str, repeat: bool) -> None:
        if self._listener is not None:
            await self._listener(step, trigger, repeat)
