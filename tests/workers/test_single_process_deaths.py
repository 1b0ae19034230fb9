"""One process of a run killed alone, from outside, at a moment the product does not announce.

The environment server is started again on its port and the run goes on; so is the embedded
Temporal server, on its database; a trainer rank's death (a two-rank trainer here) has the run
replace the whole trainer group and restore into it by itself, keeping the engine and the
environment server; a new trainer that dies again before a train step, past
`train.max_rebuilds`, stops the run with one line naming it, and running the same command
again recovers; that controller killed alone, with no new one coming back, leaves processes
that stop by themselves. The invariants hold over all of it (the rank deaths' rebuilds included:
each is an incarnation of its own that restores into a two-rank group and trains). The processes are found the way
`turnkeep chaos --target` finds them: by the pid files in the run directory. One run of the
whole stack serves every death (a start costs more than any of them).
"""

from __future__ import annotations

import os
import random
import signal
import time

import psutil
import pytest

from tests.run_command import (
    metrics,
    ray_worker_logs,
    short_run_dir,
    small_run_settings,
    train_steps,
    turnkeep,
    wait_until,
)
from tests.workers.ray_cluster.test_security import assert_every_listening_socket_is_on_loopback
from tests.workers.test_controller_crash import _kill_controller_alone, _running
from turnkeep.chaos.verdict import check_run_dir
from turnkeep.primitives.audit_log import read_audit
from turnkeep.primitives.pid_files import live_pid, live_pids

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


def _kill_and_see_it_repaired(run_dir, role: str, proc) -> int:
    """Kill `role`'s server alone; a new one comes up and the run trains and publishes on. The killed pid."""
    killed = _kill_alone(run_dir, role)
    steps_at_kill, published_at_kill = train_steps(run_dir), _published(run_dir)
    wait_until(lambda: live_pid(run_dir, role) not in (None, killed), 120, f"a new {role} server", proc)
    wait_until(lambda: train_steps(run_dir) >= steps_at_kill + 4 and _published(run_dir) > published_at_kill,
               300, f"training and a new snapshot after the {role} server's restart", proc)
    return killed


def _kill_each_new_trainer_before_it_trains(run_dir, proc, killed: int, log) -> None:
    """The moment is pinned: a new trainer's pid file is written before it restores, refits the engine and
    trains, which takes seconds; it is killed the moment its file names it. The run must then exit: a run that
    printed its stop and stayed alive (a Temporal worker left waiting for a server already stopped) fails here
    with its log, not at the test's timeout."""
    deadline = time.monotonic() + STOP_AFTER_TRAINER_DEATHS_S
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"the run did not exit:\n{log.read_text()[-3000:]}"
        pid = live_pid(run_dir, "trainer")
        if pid not in (None, killed):
            os.kill(pid, signal.SIGKILL)
            killed = pid
        time.sleep(0.02)


STOP_AFTER_TRAINER_DEATHS_S = 240.0
"""Two trainer starts (about 11 s each here) and the stop: a minute at most on 2 cores; the rest is load."""


def test_each_process_killed_alone_is_started_again_or_stops_the_run_in_one_line(stack_config) -> None:
    run_dir = short_run_dir("tk-deaths-")
    log = run_dir.parent / "turnkeep.log"
    settings = small_run_settings(stack_config)
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, "--set", "train.ranks=2",
                    "--set", "train.max_rebuilds=1", log=log)
    try:
        wait_until(lambda: _published(run_dir) > 0 and train_steps(run_dir) >= 3, 300, "training and a snapshot",
                   proc)
        assert_every_listening_socket_is_on_loopback(proc, run_dir)  # a default run listens on loopback only
        _kill_and_see_it_repaired(run_dir, "env", proc)
        temporal_killed = _kill_and_see_it_repaired(run_dir, "temporal", proc)
        engine, env = live_pid(run_dir, "policy"), live_pid(run_dir, "env")
        rank_killed = _kill_and_see_it_repaired(run_dir, "trainer.rank1", proc)
        assert (live_pid(run_dir, "policy"), live_pid(run_dir, "env")) == (engine, env)  # kept, not restarted
        # The new group trained on; its rank 0 is killed now, and every trainer after it before a step.
        _kill_each_new_trainer_before_it_trains(run_dir, proc, _kill_alone(run_dir, "trainer"), log)
        assert proc.wait(timeout=150) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "environment server" in text and "starting it again on the same port" in text
    # The absence spent no prompts: rollouts waited for the server instead of failing through the dataset.
    assert log.stat().st_size < 5_000_000
    assert f"the embedded Temporal server (pid {temporal_killed}) exited unexpectedly (killed by SIGKILL)" in text
    assert "the embedded Temporal server is back" in text and "RPCError" not in text, text[-3000:]
    [restart] = metrics(run_dir, "temporal_restart")
    assert restart["old_pid"] == temporal_killed and restart["restarts"] == 1
    assert not (run_dir / "pids" / "temporal.json").exists()  # stopped with the run
    rebuilt = [line for line in text.splitlines() if "rebuilding the trainer and restoring into it" in line]
    assert len(rebuilt) == 2 and all("(1 of at most 1 in a row)" in line for line in rebuilt), rebuilt
    assert [m["rebuild_in_a_row"] for m in metrics(run_dir, "trainer_rebuild")] == [1, 1]
    assert "trainer rank 1 of 2 died" in ray_worker_logs(run_dir)  # forwarded to `text` only when Ray was in time
    # The rank's death was repaired by a rebuild that restored into a new two-rank group, which trained on.
    first_run_steps = metrics(run_dir, "train_step")
    assert {m["trainer_ranks"] for m in first_run_steps} == {2}
    rebuilt_restores = [e for e in read_audit(run_dir) if e.event == "restored"]
    assert rebuilt_restores and all(e.source != "fresh" for e in rebuilt_restores), rebuilt_restores
    # Whenever the rank died, the new group loaded the ranks' copies of the step the group had reached (the copies
    # of a step are complete before the controller hears of it): no step was undone.
    after_rank = rebuilt_restores[0]
    assert after_rank.kept_after_cut is not None and after_rank.kept_after_cut.undone_steps == [], after_rank
    assert first_run_steps[-1]["t"] > rebuilt_restores[0].t
    assert str(rank_killed) not in live_pids(run_dir).values()
    stopped = [line for line in text.splitlines() if line.startswith("turnkeep: the run was stopped")]
    assert len(stopped) == 1 and "the trainer process died" in stopped[0], text[-3000:]
    assert "and so did each of the 1 trainer(s) rebuilt in a row before it, before a train step" in stopped[0]
    assert not _tracebacks(text), _tracebacks(text)

    # The same command again recovers; this time the controller is killed alone and none comes back.
    steps = train_steps(run_dir)
    restart_log = run_dir.parent / "restart.log"
    again = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings,
                     "--set", "ray.survive_controller_s=5", log=restart_log)
    try:
        wait_until(lambda: train_steps(run_dir) > steps, 300, "a train step after the restore", again)
        assert "turnkeep: restored from" in restart_log.read_text()
        ray_pids = [p.pid for p in psutil.Process(live_pid(run_dir, "ray")).children(recursive=True)]
        survivors = _kill_controller_alone(again, run_dir)
        began = time.monotonic()
        wait_until(lambda: not any(live_pid(run_dir, role) for role in ("trainer", "policy", "env", "ray")), 90,
                   "the orphaned processes to stop")
        stopped_in = time.monotonic() - began
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
    print(f"\norphans stopped {stopped_in:.1f} s after the controller's death (ray.survive_controller_s = 5)")
    assert stopped_in >= 3.0, "they stopped before the controller had time to come back"
    assert not [pid for pid in ray_pids if _running(pid)]
    keeper_log = (run_dir / "ray_keeper.log").read_text()
    assert "no new one started within ray.survive_controller_s = 5 s" in keeper_log
    assert survivors["ray"] not in live_pids(run_dir).values()
    verdict = check_run_dir(run_dir)
    assert verdict.ok, verdict.format()
