import subprocess
import sys
import time
from pathlib import Path

import psutil

from turnkeep.primitives.process_tree import kill_tree

# bash -> two sleeps and a subshell with its own sleep; plus an orphan: a sleep whose
# parent subshell exits at once, so it hangs off init but stays in the session.
TREE_SCRIPT = """
( sleep 300 & echo $! > {orphan} ) &
sleep 300 &
sleep 300 &
( sleep 300 & wait ) &
wait
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for_tree(root: psutil.Process, orphan_file: Path, size: int) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = root.children(recursive=True)
        if len(children) >= size and orphan_file.exists() and orphan_file.read_text().strip():
            return [c.pid for c in children]
        time.sleep(0.05)
    raise AssertionError("the test tree did not start")


def test_kill_tree_kills_descendants_and_session_orphans(tmp_path):
    orphan_file = tmp_path / "orphan.pid"
    proc = subprocess.Popen(["bash", "-c", TREE_SCRIPT.format(orphan=orphan_file)], start_new_session=True)
    try:
        children = _wait_for_tree(psutil.Process(proc.pid), orphan_file, size=4)
        orphan = int(orphan_file.read_text())
        assert orphan not in children

        killed = kill_tree(proc.pid, timeout_s=10)

        assert killed >= len(children) + 2  # the root and the orphan too
        assert all(_gone(pid) for pid in [*children, orphan])
        # The root stays a zombie for its parent to reap, so its exit status is the SIGKILL.
        assert proc.wait(timeout=5) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_kill_tree_of_a_process_that_is_gone_kills_nothing():
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert kill_tree(proc.pid) == 0


def test_kill_tree_outside_its_own_session_spares_the_session(tmp_path):
    # Not a session leader: only the process and its descendants die, not this test's session.
    proc = subprocess.Popen(["bash", "-c", "sleep 300 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kill_tree(proc.pid, timeout_s=10) == 2
        assert proc.wait(timeout=5) == -9
        assert psutil.Process().is_running()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_kill_children_kills_a_stopped_descendant_and_spares_the_caller():
    # In a process of its own (this test's process has children of its own to keep): a SIGSTOPped child, as a hung
    # engine core, dies by SIGKILL, and the process that asks goes on to say so.
    script = ("import os, signal, subprocess, sys; from turnkeep.primitives.process_tree import kill_children; "
              "child = subprocess.Popen(['sleep', '300']); child.send_signal(signal.SIGSTOP); "
              "print(kill_children(os.getpid(), timeout_s=10), child.wait(timeout=5))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "-9"]
