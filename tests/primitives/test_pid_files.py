"""A pid file names a process only while that very process runs: not after it exits, not when its
pid is reused by another one."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import psutil

from turnkeep.primitives.pid_files import live_pid, live_pids, pid_file, write_pid_file


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
    record["start_ticks"] -= 1  # the pid was another process's, started a tick earlier
    pid_file(tmp_path, "trainer").write_bytes(orjson.dumps(record))
    assert live_pid(tmp_path, "trainer") is None
    record["start_ticks"] += 1
    record["boot_id"] = "another-boot"  # the same pid and tick, but before a reboot
    pid_file(tmp_path, "trainer").write_bytes(orjson.dumps(record))
    assert live_pid(tmp_path, "trainer") is None
    pid_file(tmp_path, "trainer").write_text("{torn")
    assert live_pid(tmp_path, "trainer") is None and live_pid(tmp_path, "policy") is None


def test_a_wall_clock_stepped_after_the_file_was_written_still_names_the_process(tmp_path, monkeypatch) -> None:
    """psutil's create time is the start tick plus /proc/stat's btime, and btime moves with the wall clock: a CI
    run saw it move by 1 s, and a live controller and environment server looked gone."""
    write_pid_file(tmp_path, "controller", os.getpid())
    booted = psutil.boot_time()
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: booted + 1.0)
    assert psutil.Process(os.getpid()).create_time() > orjson.loads(pid_file(tmp_path, "controller").read_bytes())[
        "create_time"] + 0.9  # what the old check compared, moved
    assert live_pid(tmp_path, "controller") == os.getpid()


def test_a_file_an_older_version_wrote_is_still_read_by_its_create_time(tmp_path) -> None:
    legacy = {"role": "env", "pid": os.getpid(), "create_time": psutil.Process(os.getpid()).create_time()}
    pid_file(tmp_path, "env").parent.mkdir()
    pid_file(tmp_path, "env").write_bytes(orjson.dumps(legacy))
    assert live_pid(tmp_path, "env") == os.getpid()
    legacy["create_time"] -= 100.0
    pid_file(tmp_path, "env").write_bytes(orjson.dumps(legacy))
    assert live_pid(tmp_path, "env") is None
