"""Every token an engine generated, counted by the engine itself and kept where a kill cannot take it.

vLLM's front end hands each engine step's stats to its stat loggers; `gpu_workers.tally_stat_logger` adds the step's
generated tokens to a counter in a memory-mapped file. A SIGKILL of the whole tree leaves the file's pages with the
kernel, so the count is right to the last step the front end received, what a kill cost included (a machine that
loses power loses the page cache too; the count is then as old as the last writeback).

One file per engine process and run incarnation, `<run_dir>/engines/tokens/inc<I>-engine<E>-pid<P>.tally`,
holds little-endian uint64 slots (`SLOTS`). What a kill cost is what the engines generated beyond what reached a
committed turn (`chaos.invariants.engine_tokens`).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

TALLY_DIR = "engines/tokens"
SLOTS = ("generated", "probes")
"""`generated`: every token the engine core sampled (all requests); `probes`: of them, the liveness probes' and the
warm-up's (one each), which are no rollout's."""
GENERATED, PROBES = range(len(SLOTS))
_SLOT = struct.Struct("<Q")


def tally_dir(run_dir: Path) -> Path:
    return run_dir / TALLY_DIR


class TokenTally:
    """The counters of one engine process, in a file from `start` on (none before: the counts stay in memory)."""

    def __init__(self) -> None:
        self._counts = [0] * len(SLOTS)
        self._map: mmap.mmap | None = None
        self.path: Path | None = None

    def start(self, folder: Path, incarnation: int, engine: int) -> Path:
        """Count into a new file for this run incarnation from now on (a re-attached engine starts another)."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"inc{incarnation}-engine{engine}-pid{os.getpid()}.tally"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, _SLOT.size * len(SLOTS))
            mapped = mmap.mmap(fd, _SLOT.size * len(SLOTS))
        finally:
            os.close(fd)
        self._counts = [0] * len(SLOTS)
        old, self._map, self.path = self._map, mapped, path
        if old is not None:
            old.close()
        self._write_all()
        return path

    def add(self, slot: int, tokens: int) -> None:
        if tokens <= 0:
            return
        self._counts[slot] += tokens
        if self._map is not None:
            _SLOT.pack_into(self._map, slot * _SLOT.size, self._counts[slot])

    def count(self, slot: int) -> int:
        return self._counts[slot]

    def _write_all(self) -> None:
        if self._map is None:
            return
        for slot, count in enumerate(self._counts):
            _SLOT.pack_into(self._map, slot * _SLOT.size, count)


def read_tally(path: Path) -> dict[str, int]:
    """The counters of one tally file, by slot name (a short file: what was written of it, the rest 0)."""
    raw = path.read_bytes()
    return {name: (_SLOT.unpack_from(raw, i * _SLOT.size)[0] if len(raw) >= (i + 1) * _SLOT.size else 0)
            for i, name in enumerate(SLOTS)}


