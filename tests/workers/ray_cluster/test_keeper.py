"""The Ray keeper's watch: it stops the run's Ray on the controller's stop, when Ray's head
exits, and when the controller stays dead past `ray.survive_controller_s`, never while a
controller (the old one or a new one) is alive; and its session stop leaves nothing behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import orjson
import psutil

from turnkeep.primitives.pid_files import write_pid_file
from turnkeep.workers.ray_cluster.keeper import _watch


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _dead_controller(run_dir) -> None:
    proc = _sleeper()
    write_pid_file(run_dir, "controller", proc.pid)
    proc.kill()
    proc.wait()


def test_a_dead_controller_stops_the_head_only_after_the_survival_window(tmp_path) -> None:
    _dead_controller(tmp_path)
    head = _sleeper()
    try:
        began = time.monotonic()
        reason = _watch(head, tmp_path, 1.0, [])
        waited = time.monotonic() - began
    finally:
        head.kill()
    assert "no new one started within ray.survive_controller_s = 1 s" in reason
    assert waited >= 1.0


def test_a_new_controller_within_the_window_keeps_the_head(tmp_path) -> None:
    _dead_controller(tmp_path)
    head = _sleeper()
    stop: list[int] = []
    # A new controller writes its pid file after 0.5 s; the watch must then run on until told to stop.
    threading.Timer(0.5, lambda: write_pid_file(tmp_path, "controller", psutil.Process().pid)).start()
    threading.Timer(3.0, lambda: stop.append(signal.SIGTERM)).start()
    try:
        reason = _watch(head, tmp_path, 1.5, stop)
    finally:
        head.kill()
    assert reason == "signal SIGTERM (the controller's stop)"


BEATING_CONTROLLER = ("import asyncio, sys; from pathlib import Path; from turnkeep.primitives import heartbeat; "
                      "asyncio.run(heartbeat.beat_forever(heartbeat.beat_file(Path(sys.argv[1]), 'controller'), 0.1))")


def test_a_frozen_controller_is_killed_by_pid_and_then_waited_for_as_a_dead_one(tmp_path) -> None:
    """A controller that beats, then is SIGSTOPped: its beat ages, the keeper SIGKILLs it after the hang window
    (one `hang` line), and the survival window then runs as for any dead controller. While it beat, nothing
    happened to it."""
    controller = subprocess.Popen([sys.executable, "-c", BEATING_CONTROLLER, str(tmp_path)])
    head = _sleeper()
    try:
        while not (tmp_path / "pids" / "controller.beat").exists():
            time.sleep(0.05)
        write_pid_file(tmp_path, "controller", controller.pid)
        threading.Timer(1.5, controller.send_signal, [signal.SIGSTOP]).start()
        began = time.monotonic()
        reason = _watch(head, tmp_path, 1.0, [], hang_s=1.0)
        waited = time.monotonic() - began
        assert controller.wait(5) == -signal.SIGKILL
    finally:
        head.kill()
        controller.kill()
    assert "no new one started within ray.survive_controller_s = 1 s" in reason
    assert waited >= 1.5 + 1.0 + 1.0  # beating, then silent for the hang window, then dead for the survival window
    [hang] = [orjson.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes().splitlines()]
    assert hang["kind"] == "hang" and hang["target"] == "controller" and hang["pid"] == controller.pid
    assert hang["probe"] == "heartbeat"


def test_the_heads_exit_ends_the_watch(tmp_path) -> None:
    write_pid_file(tmp_path, "controller", psutil.Process().pid)
    head = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert _watch(head, tmp_path, 60.0, []) == "Ray's head process exited with 3"


def test_the_session_stop_takes_every_process_of_the_session() -> None:
    script = (
        "import os, subprocess, sys\n"
        "from turnkeep.workers.ray_cluster.keeper import stop_session\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']) for _ in range(2)]\n"
        "# One ignores SIGTERM, as a stuck engine would: it is SIGKILLed after the grace. It says when its handler\n"
        "# is set (a fixed wait lost that race to a loaded machine's slow start).\n"
        "kids.append(subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)'], "
        "stdout=subprocess.PIPE))\n"
        "kids[-1].stdout.readline()\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "print(stop_session({os.getpid()}, grace_s=1.0), flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         start_new_session=True)
    lines = out.stdout.strip().splitlines()
    pids_line, count_line = lines[0], lines[-1]
    assert int(count_line) == 3, out.stderr
    assert "1 workers did not stop within 1 s of SIGTERM and were killed" in out.stdout
    for pid in map(int, pids_line.split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
