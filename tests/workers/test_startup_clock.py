import asyncio
import subprocess
import sys
import time
from pathlib import Path

import orjson

from turnkeep.workers.startup_clock import StartupClock, marked

ROOT = Path(__file__).resolve().parents[2]


def test_each_phase_keeps_its_first_mark_in_seconds_from_the_process_start(tmp_path, monkeypatch):
    now = [105.0]
    monkeypatch.setattr("turnkeep.workers.startup_clock.time.time", lambda: now[0])
    clock = StartupClock(began_unix_s=100.0)
    clock.mark("ray")
    now[0] = 112.5
    clock.mark("engines")
    clock.mark("ray")  # a second mark of a phase moves nothing
    assert clock.marks == {"ray": 5.0, "engines": 12.5}
    clock.record(tmp_path, 3)
    line = orjson.loads((tmp_path / "metrics.jsonl").read_bytes())
    assert line["kind"] == "startup" and line["incarnation"] == 3 and line["process_start_unix_s"] == 100.0
    assert line["seconds"] == {"ray": 5.0, "engines": 12.5}


def test_marked_marks_the_moment_its_awaitable_is_done_and_passes_its_result():
    clock = StartupClock(began_unix_s=0.0)

    async def slow() -> str:
        assert "trainer" not in clock.marks
        await asyncio.sleep(0)
        return "loaded"

    assert asyncio.run(marked(clock, "trainer", slow())) == "loaded"
    assert clock.marks["trainer"] > 0
    assert asyncio.run(marked(None, "trainer", asyncio.sleep(0, "alone"))) == "alone"  # no clock: the result only


def test_the_default_start_is_this_process_s_own_to_the_kernel_s_tick():
    import psutil

    began = StartupClock().began_unix_s
    assert abs(began - psutil.Process().create_time()) < 1.1  # psutil's is off by its boot time's rounding only
    assert began < time.time()
    # A process started now started after this moment (to the kernel's 10 ms tick), not up to a second before it.
    before = time.time()
    child = subprocess.run([sys.executable, "-c", "import time; from turnkeep.workers.startup_clock import "
                            "process_start_unix_s as s; print(s(), time.time())"],
                           capture_output=True, text=True, check=True, cwd=ROOT)
    started, child_now = map(float, child.stdout.split())
    assert before - 0.011 <= started <= child_now, (before, started, child_now)
