"""A pid file names a process only while that very process runs: not after it exits, not when its
pid is reused by another one."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson

from primitives.pid_files import live_pid, live_pids, pid_file, write_pid_file


def test_a_pid_file_names_its_process_only_while_it_runs(tmp_path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        write_pid_file(tmp_path, "env", child.pid)
        write_pid_file(tmp_path, "controller", os.getpid())
        assert live_pids(tmp_path) == {"controller": os.getpid(), "env": child.pid}
        assert oct(pid_file(tmp_path, "env").parent.stat().st_mode & 0o777) == "0o700"  # the run user's only
    finally:
        child.kill()
        child.wait()
    assert live_pid(tmp_path, "env") is None
    assert live_pids(tmp_path) == {"controller": os.getpid()}


def test_a_reused_pid_names_nothing(tmp_path) -> None:
    write_pid_file(tmp_path, "trainer", os.getpid())
    record = orjson.loads(pid_file(tmp_path, "trainer").read_bytes())
    record["create_time"] -= 100.0  # the pid was another process's, started earlier
    pid_file(tmp_path, "trainer").write_bytes(orjson.dumps(record))
    assert live_pid(tmp_path, "trainer") is None
    pid_file(tmp_path, "trainer").write_text("{torn")
    assert live_pid(tmp_path, "trainer") is None and live_pid(tmp_path, "policy") is None
