"""An engine's token tally survives a SIGKILL of its process: the counts live in a memory-mapped file whose pages
the kernel keeps, so a reader after the kill sees every token counted before it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from turnkeep.primitives.token_tally import GENERATED, PROBES, TokenTally, read_tally

COUNT_THEN_DIE = """
import os, signal, sys
from pathlib import Path
from turnkeep.primitives.token_tally import TokenTally
tally = TokenTally()
path = tally.start(Path(sys.argv[1]), 3, 0)
for _ in range(1000):
    tally.add(0, 7)
tally.add(1, 2)
print(path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_counts_made_before_a_sigkill_are_in_the_file_after_it(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", COUNT_THEN_DIE, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL
    path = Path(proc.stdout.strip())
    assert path.name.startswith("inc3-engine0-pid") and read_tally(path) == {"generated": 7000, "probes": 2}


def test_a_new_incarnation_counts_from_zero_in_a_file_of_its_own(tmp_path: Path) -> None:
    tally = TokenTally()
    tally.add(GENERATED, 5)  # before any file: kept in memory only
    first = tally.start(tmp_path, 1, 2)
    tally.add(GENERATED, 11)
    tally.add(PROBES, 1)
    second = tally.start(tmp_path, 2, 2)
    tally.add(GENERATED, 4)
    assert first != second
    assert read_tally(first) == {"generated": 11, "probes": 1}
    assert read_tally(second) == {"generated": 4, "probes": 0} and tally.count(GENERATED) == 4
