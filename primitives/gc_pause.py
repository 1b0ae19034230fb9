"""Keep Python's cyclic garbage collector out of short, allocation-heavy critical sections.

Copying a data plane of 100k rows allocates millions of small containers; every full
collection triggered meanwhile walks the whole heap, and under the data-plane barrier
that stall stops every row and ACK (measured by `turnkeep bench scaling`: about 80% of
a 100k-row cut). Nothing here creates reference cycles that must be freed at once, so
the collector simply waits until the section ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
