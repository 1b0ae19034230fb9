"""The trainer's weights put into Ray's object store once per policy version, for every engine that loads them at
once (a restore loads the restored weights into each engine through its own activity: without this, the trainer
serialized them once per engine). The reference is kept only for `KEEP_S`, so a large model's copy does not stay
in the store between restores."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

KEEP_S = 120.0


class SharedWeights:
    def __init__(self, put: Callable[[bytes], object], keep_s: float = KEEP_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._put, self._keep_s, self._clock = put, keep_s, clock
        self._kept: tuple[int, float, object] | None = None

    async def ref(self, version: int, blob: Callable[[], Awaitable[bytes]]) -> object:
        """The object of `version`'s weights, made with `blob()` only when none is kept for that version."""
        now = self._clock()
        if self._kept is None or self._kept[0] != version or now - self._kept[1] > self._keep_s:
            self._kept = (version, now, self._put(await blob()))
        return self._kept[2]

    def forget(self) -> None:
        """The weights changed without a new version (a checkpoint was loaded)."""
        self._kept = None
