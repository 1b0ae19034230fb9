"""The controller (`turnkeep run`) killed alone, as the OOM killer would: the trainer, the
policy server, the environment server, Ray and Temporal live on, and the same command
started again re-attaches to them instead of starting them anew, fences them with its
incarnation and restores as usual; with other settings it stops them and starts fresh
ones; and when no controller comes back they stop by themselves."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from primitives.audit_log import read_audit
from primitives.pid_files import live_pid, live_pids
from tests.run_command import metrics, short_run_dir, small_run_settings, train_steps, turnkeep, wait_until
from workers.chaos_invariants import check_run_dir

pytestmark = pytest.mark.integration

SURVIVORS = ("trainer", "policy", "env", "ray", "temporal")


def _published(run_dir) -> int:
    if not (run_dir / "metrics.jsonl").exists():
        return 0
    return sum(m["outcome"] == "published" for m in metrics(run_dir, "snapshot"))


def _kill_controller_alone(proc, run_dir) -> dict[str, int]:
    before = {role: live_pid(run_dir, role) for role in SURVIVORS}
    assert None not in before.values(), before
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    after = {role: live_pid(run_dir, role) for role in SURVIVORS}
    assert after == before, f"a process died with the controller: {before} -> {after}"
    return before


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _first_turn_after_start(run_dir, incarnation: int) -> float:
    events = list(read_audit(run_dir))
    [started] = [e for e in events if e.event == "run_started" and e.inc == incarnation]
    turns = [e.t for e in events if e.event == "turn_committed" and e.inc == incarnation]
    assert turns, f"incarnation {incarnation} generated nothing"
    return min(turns) - started.t


def test_a_restarted_controller_reattaches_to_what_the_killed_one_left_and_other_settings_start_afresh(
        stack_config) -> None:
    run_dir = short_run_dir("tk-ctlcrash-")
    log = run_dir.parent / "turnkeep.log"
    settings = small_run_settings(stack_config)
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, log=log)
    try:
        wait_until(lambda: _published(run_dir) > 0 and train_steps(run_dir) >= 3, 300, "training and a snapshot",
                   proc)
        survivors = _kill_controller_alone(proc, run_dir)

        # The same command again: the survivors are re-attached, not started again.
        steps = train_steps(run_dir)
        launched = time.time()
        proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", str(steps + 3), *settings, log=log)
        wait_until(lambda: train_steps(run_dir) > steps, 300, "a train step after the restart", proc)
        restarted_in = time.time() - launched
        text = log.read_text()
        assert "re-attached the trainer, the policy server and the environment server" in text, text[-3000:]
        for role in ("trainer", "policy", "env", "ray"):
            assert live_pid(run_dir, role) == survivors[role], role
        first_turn_s = _first_turn_after_start(run_dir, 2)
        print(f"\ncontroller-only crash: restart to first train step {restarted_in:.1f} s (process start), "
              f"run start to first generated turn {first_turn_s:.1f} s")
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        # A normal end stops everything, the processes it adopted included.
        wait_until(lambda: not live_pids(run_dir), 60, "every process of the run to stop")

        # Killed alone again, then restarted with other settings: the survivors are stopped, fresh ones start.
        proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, log=log)
        wait_until(lambda: train_steps(run_dir) >= steps + 5, 300, "training after the clean restart", proc)
        survivors = _kill_controller_alone(proc, run_dir)
        steps = train_steps(run_dir)
        proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", str(steps + 2), *settings,
                        "--set", "rollout.temperature=0.9", log=log)
        wait_until(lambda: live_pid(run_dir, "trainer") not in (None, survivors["trainer"]), 300,
                   "a new trainer", proc)
        for role in ("trainer", "policy", "env"):
            assert not _running(survivors[role]), f"the old {role} was not stopped"
        assert proc.wait(timeout=400) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "not re-attaching the processes an earlier controller left running (trainer was started with other " \
           "settings)" in text, text[-3000:]
    restored = [e for e in read_audit(run_dir) if e.event == "restored"]
    assert len(restored) == 3 and all(e.source != "fresh" for e in restored), [(e.inc, e.source) for e in restored]
    verdict = check_run_dir(run_dir)
    assert verdict.ok, verdict.format()


def test_what_a_killed_controller_left_stops_by_itself_when_no_controller_comes_back(stack_config) -> None:
    run_dir = short_run_dir("tk-orphans-")
    log = run_dir.parent / "turnkeep.log"
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *small_run_settings(stack_config),
                    "--set", "ray.survive_controller_s=5", log=log)
    try:
        wait_until(lambda: train_steps(run_dir) >= 2, 300, "two train steps", proc)
        ray_pids = [p.pid for p in psutil.Process(live_pid(run_dir, "ray")).children(recursive=True)]
        survivors = _kill_controller_alone(proc, run_dir)
        began = time.monotonic()
        wait_until(lambda: not any(live_pid(run_dir, role) for role in ("trainer", "policy", "env", "ray")), 90,
                   "the orphaned processes to stop")
        stopped_in = time.monotonic() - began
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"\norphans stopped {stopped_in:.1f} s after the controller's death (ray.survive_controller_s = 5)")
    assert stopped_in >= 3.0, "they stopped before the controller had time to come back"
    assert not [pid for pid in ray_pids if _running(pid)]
    keeper_log = (run_dir / "ray_keeper.log").read_text()
    assert "no new one started within ray.survive_controller_s = 5 s" in keeper_log
    assert survivors["ray"] not in live_pids(run_dir).values()
