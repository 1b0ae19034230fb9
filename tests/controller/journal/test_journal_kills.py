"""SIGKILL a process that journals, cuts, rotates segments and prunes, at random moments: every cut it reported
replays to exactly the state it held, or (its segments pruned) is refused by name; never a wrong state."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from turnkeep.controller.journal.replay import resolve_state
from turnkeep.primitives.segment_format import JournalCorrupt
from turnkeep.primitives.segment_log import SegmentLog

REPO = Path(__file__).resolve().parents[3]

WRITER = r"""
import asyncio, random, sys
from pathlib import Path
import orjson
from turnkeep.controller.journal.state_journal import write_base
from turnkeep.primitives.atomic_files import atomic_write_bytes
from turnkeep.primitives.segment_reader import prune_before
from tests.controller.journal.journal_harness import JournaledState

run_dir = Path(sys.argv[1])
rng = random.Random(int(sys.argv[2]))

async def main():
    state = JournaledState()
    journal = state.start(run_dir, 1, segment_bytes=4096)
    (run_dir / "cuts").mkdir()
    n = 0
    while True:
        for _ in range(rng.randint(1, 40)):
            state.random_change(rng)
        saved, live = state.cut()
        position = journal.position()
        await journal.durable(position.seq)
        n += 1
        atomic_write_bytes(run_dir / "cuts" / f"{n:06d}.json", orjson.dumps({"saved": saved, "live": live}))
        print(n, flush=True)
        if n % 4 == 0:  # as a trainer checkpoint does: a full base at this position, then pruning
            base = run_dir / "bases" / f"{n:06d}.json"
            base.parent.mkdir(exist_ok=True)
            write_base(base, {**live}, journal, position)
            journal.rebase(base, position)
            prune_before(journal.directory, journal.keep_from_seq)

asyncio.run(main())
"""


def _run_and_kill(run_dir: Path, seed: int, delay_s: float) -> int:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), str(seed)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()  # imports done, the first cut written
    assert first.strip(), proc.stderr.read().decode()[-2000:]
    time.sleep(delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
    return int(first) + len(out.split())


@pytest.mark.parametrize("seed", range(4))
def test_every_reported_cut_survives_a_kill_at_a_random_moment(tmp_path, seed):
    delay_s = random.Random(seed).uniform(0.2, 1.2)
    reported = _run_and_kill(tmp_path, seed, delay_s)
    assert reported >= 4, "the writer never got far enough to rotate and prune"
    journal = tmp_path / "journal" / "inc-000001"
    assert len(list(journal.glob("*.seg"))) >= 1
    SegmentLog(journal, "run-test/inc-1").close()  # the killed journal opens again (a torn tail is cut off)
    replayed = pruned = 0
    for path in sorted((tmp_path / "cuts").glob("*.json"))[:reported]:
        cut = orjson.loads(path.read_bytes())
        try:
            state = resolve_state(tmp_path, cut["saved"])
        except JournalCorrupt as err:
            assert "older than the oldest kept segment" in str(err), err
            pruned += 1
            continue
        assert {k: state[k] for k in cut["live"]} == cut["live"], path.name
        replayed += 1
    newest = orjson.loads(sorted((tmp_path / "cuts").glob("*.json"))[-1].read_bytes())
    state = resolve_state(tmp_path, newest["saved"])
    assert {k: state[k] for k in newest["live"]} == newest["live"]
    assert replayed >= 1 and replayed + pruned >= reported
    print(f"reported {reported}, replayed {replayed}, refused as pruned {pruned}")
