"""SIGTERM, as a scheduler sends it: one final snapshot, exit 0, and the restart continues from it."""

from __future__ import annotations

import signal

import pytest

from primitives.audit_log import read_audit
from tests.run_command import metrics, short_run_dir, small_run_settings, train_steps, turnkeep, wait_until
from tests.workers.ray_cluster.test_security import assert_every_listening_socket_is_on_loopback

pytestmark = pytest.mark.integration


def test_sigterm_saves_a_final_snapshot_and_the_restart_continues_from_it(stack_config) -> None:
    run_dir = short_run_dir("tk-preempt-")
    log = run_dir.parent / "turnkeep.log"
    settings = [*small_run_settings(stack_config), "--set", "snapshot.preemption_grace_s=90"]
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, log=log)
    try:
        wait_until(lambda: train_steps(run_dir) >= 6, 300, "six train steps", proc)
        assert_every_listening_socket_is_on_loopback(proc, run_dir)  # a default run listens on loopback only
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=150) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert "preempted at step" in output and "saved snapshot" in output, output[-2000:]
    final = [m for m in metrics(run_dir, "snapshot") if m["trigger"] == "preemption"]
    # A preemption attempt the trainer outran is skipped and asked for again; the last one publishes.
    assert [m["outcome"] for m in final[:-1]] == ["skipped"] * (len(final) - 1), final
    assert final[-1]["outcome"] == "published", final
    stopped_at = final[-1]["anchor_step"]
    [ended] = [e for e in read_audit(run_dir) if e.event == "run_ended"]
    assert ended.reason.startswith("preempted")
    assert ended.admission_holders == ended.deadline_holders == ended.trainer_holders == []

    restart = turnkeep("run", "--run-dir", str(run_dir), "--steps", str(stopped_at + 2), *settings, log=log)
    assert restart.wait(timeout=300) == 0, log.read_text()[-3000:]
    [restored] = [e for e in read_audit(run_dir) if e.event == "restored"]
    assert restored.source == "snapshot" and restored.step == stopped_at
    assert restored.snapshot_dir == final[-1]["snapshot_dir"]
    assert restored.inc == 2
    [recovery] = metrics(run_dir, "recovery")
    assert recovery["source"]["kind"] == "snapshot" and recovery["restore"]["step"] == stopped_at
    assert set(recovery["seconds"]) == {"cancel_stale", "choose_source", "restore", "load_weights", "resume"}
    # Only the run's user can read what it wrote: the directory, Temporal's database, checkpoints and
    # snapshots. (Ray makes its own folders 0777; they are inside the 0700 run directory.)
    assert run_dir.stat().st_mode & 0o777 == 0o700
    opened = [f"{oct(p.stat().st_mode & 0o777)} {p}" for p in run_dir.rglob("*")
              if p.relative_to(run_dir).parts[0] != "ray" and p.stat().st_mode & 0o077]
    assert not opened, opened


def test_a_second_signal_exits_at_once_and_leaves_no_process_behind(stack_config) -> None:
    import psutil

    run_dir = short_run_dir("tk-preempt2-")
    log = run_dir.parent / "turnkeep.log"
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *small_run_settings(stack_config), log=log)
    try:
        wait_until(lambda: train_steps(run_dir) >= 2, 300, "two train steps", proc)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "taking a final snapshot" in log.read_text(), 10, "the first signal's message")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
        assert "exiting at once" in log.read_text()
        psutil.wait_procs(children, timeout=15)
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            proc.kill()
