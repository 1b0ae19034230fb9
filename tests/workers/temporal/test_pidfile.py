"""A pid is not an identity: a process is told apart by its start time and its command
line, and a process that is not the one recorded is never signalled."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from turnkeep.workers.temporal.pidfile import ProcessId, is_dev_server_on, read_record, record_path, terminate


def test_a_reused_pid_is_another_process_and_is_not_signalled() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        true = ProcessId.of(sleeper.pid)
        assert true is not None and true.running()
        reused = ProcessId(sleeper.pid, true.start_ticks - 1)  # the same pid, started at another moment
        assert not reused.running()
        assert terminate(reused, grace_s=0.5) is False
        assert sleeper.poll() is None
        assert not is_dev_server_on(sleeper.pid, Path("/tmp/temporal.db"))
        assert terminate(true, grace_s=5) is True
        assert sleeper.wait(timeout=5) == -15  # SIGTERM first
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; echo ready; sleep 60 & wait"], stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout.readline() == b"ready\n"  # the trap is set
        assert terminate(ProcessId.of(stubborn.pid), grace_s=0.5) is True
        assert stubborn.wait(timeout=5) == -9
    finally:
        stubborn.kill()
        stubborn.wait()


def test_a_zombie_has_exited() -> None:
    child = subprocess.Popen(["true"])
    process = ProcessId.of(child.pid)
    for _ in range(100):
        if not process.running():
            break
        time.sleep(0.05)
    assert not process.running()  # exited, not yet reaped by its parent (this test)
    child.wait()


def test_a_damaged_record_is_removed(tmp_path) -> None:
    record_path(tmp_path).parent.mkdir()
    record_path(tmp_path).write_text('{"pid": 12')
    assert read_record(tmp_path) is None
    assert not record_path(tmp_path).exists()
