"""One process of a run killed alone, from outside, at a moment the product does not announce.

The environment server is started again on its port and the run goes on; the trainer's
death stops the run with one line naming it, and running the same command again recovers.
The processes are found the way `turnkeep chaos --target` finds them: by the pid files in
the run directory.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from primitives.pid_files import live_pid
from tests.run_command import metrics, short_run_dir, small_run_settings, train_steps, turnkeep, wait_until

pytestmark = pytest.mark.integration


def _published(run_dir) -> int:
    if not (run_dir / "metrics.jsonl").exists():
        return 0
    return sum(m["outcome"] == "published" for m in metrics(run_dir, "snapshot"))


def _tracebacks(text: str) -> list[str]:
    """Tracebacks of the `turnkeep run` process itself (vLLM logs its own inside the policy actor's lines)."""
    lines = text.splitlines()
    return ["\n".join(lines[i:i + 30]) for i, line in enumerate(lines) if line.startswith("Traceback")]


def _kill_alone(run_dir, role: str) -> int:
    pid = live_pid(run_dir, role)
    assert pid is not None, f"no live {role} process named in {run_dir / 'pids'}"
    time.sleep(random.Random(role).uniform(0.0, 3.0))  # not at a quiet moment the product chose
    os.kill(pid, signal.SIGKILL)
    return pid


def test_the_environment_server_killed_alone_is_started_again_then_the_trainer_killed_alone_stops_the_run(
        stack_config) -> None:
    """One run for both deaths (a start of the whole stack costs more than either): the environment server's is
    repaired and the run trains on; the trainer's then stops the run in one line; the same command recovers."""
    run_dir = short_run_dir("tk-deaths-")
    log = run_dir.parent / "turnkeep.log"
    settings = small_run_settings(stack_config)
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, log=log)
    try:
        wait_until(lambda: _published(run_dir) > 0 and train_steps(run_dir) >= 3, 300, "training and a snapshot",
                   proc)
        killed = _kill_alone(run_dir, "env")
        steps_at_kill, published_at_kill = train_steps(run_dir), _published(run_dir)
        wait_until(lambda: live_pid(run_dir, "env") not in (None, killed), 120, "a new environment server", proc)
        wait_until(lambda: train_steps(run_dir) >= steps_at_kill + 4 and _published(run_dir) > published_at_kill,
                   300, "training and a new snapshot after the restart", proc)
        _kill_alone(run_dir, "trainer")
        assert proc.wait(timeout=150) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "environment server" in text and "starting it again on the same port" in text
    # The absence spent no prompts: rollouts waited for the server instead of failing through the dataset.
    assert log.stat().st_size < 5_000_000
    stopped = [line for line in text.splitlines() if line.startswith("turnkeep: the run was stopped")]
    assert len(stopped) == 1 and "the trainer process died" in stopped[0], text[-3000:]
    assert not _tracebacks(text), _tracebacks(text)

    steps = train_steps(run_dir)
    restart_log = run_dir.parent / "restart.log"
    again = turnkeep("run", "--run-dir", str(run_dir), "--steps", str(steps + 3), *settings, log=restart_log)
    try:
        assert again.wait(timeout=400) == 0, restart_log.read_text()[-3000:]
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
    assert "turnkeep: restored from" in restart_log.read_text()
    assert train_steps(run_dir) >= steps + 3
