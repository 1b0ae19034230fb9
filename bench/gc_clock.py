"""Seconds spent in Python's cyclic garbage collector while the clock runs.

A snapshot's cut allocates millions of small containers (every row's model_dump), and
each full collection then walks the whole data plane: how much of a phase that is
cannot be told from its wall time alone.
"""

from __future__ import annotations

import gc
import time
from typing import Any


class GcClock:
    """Use as a context manager; `seconds` and `collections` grow while it is entered."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._started: float | None = None

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self.collections += 1
            self._started = None
