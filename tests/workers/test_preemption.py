"""SIGTERM, as a scheduler sends it: one final snapshot, exit 0, and the restart continues from it; a second
signal exits at once and leaves no process behind. The run uses a Temporal server started outside turnkeep (the
dev server binary in its own process stands in for docker-compose.yml's) that restarts mid-run, as a restarted
container would: the run goes on and the final snapshot goes through the new server."""

from __future__ import annotations

import asyncio
import signal
import time

import psutil
import pytest

from tests.run_command import metrics, short_run_dir, small_run_settings, train_steps, turnkeep, wait_until
from turnkeep.primitives.audit_log import read_audit
from turnkeep.schemas.config_services import TemporalConfig
from turnkeep.workers.temporal.dev_server import start_dev_server, stop_dev_server
from turnkeep.workers.temporal.ports import free_port

pytestmark = pytest.mark.integration


def _published(run_dir) -> int:
    if not (run_dir / "metrics.jsonl").exists():
        return 0
    return sum(m["outcome"] == "published" for m in metrics(run_dir, "snapshot"))


def test_sigterm_saves_a_final_snapshot_through_a_restarted_outside_temporal_and_the_restart_continues_from_it(
        stack_config) -> None:
    run_dir = short_run_dir("tk-preempt-")
    server_dir = run_dir.parent / "temporal"
    server_dir.mkdir()
    server_cfg = TemporalConfig(port=free_port("127.0.0.1"), ui_port=0)
    server = asyncio.run(start_dev_server(server_cfg, server_dir))
    log = run_dir.parent / "turnkeep.log"
    settings = [*small_run_settings(stack_config), "--set", "snapshot.preemption_grace_s=90",
                "--set", f"temporal.address=127.0.0.1:{server_cfg.port}", "--set", "snapshot.max_consecutive_failures=10"]
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, log=log)
    try:
        wait_until(lambda: _published(run_dir) > 0, 300, "a published snapshot", proc)
        # The run keeps nothing of Temporal's: no embedded server, no database in its directory.
        assert not (run_dir / "temporal.db").exists()
        steps_before, published_before = train_steps(run_dir), _published(run_dir)
        server.process.kill()
        server.process.wait()
        time.sleep(5)
        server = asyncio.run(start_dev_server(server_cfg, server_dir))  # same port, same database
        wait_until(lambda: train_steps(run_dir) >= steps_before + 4 and _published(run_dir) > published_before,
                   300, "training and a new snapshot after Temporal's restart", proc)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=150) == 0, log.read_text()[-3000:]
        print(f"\nSIGTERM -> exit 0 in {time.monotonic() - signalled:.1f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert "preempted at step" in output and "saved snapshot" in output, output[-2000:]
    # The default keeps running agents in the turn journals: the last line counts those, not "0 parked agents".
    assert "running agents kept in the turn journals" in output and "0 parked agents" not in output, output[-2000:]
    snapshots = metrics(run_dir, "snapshot")
    # Every attempt ended with an outcome and a reason: the one cut off by Temporal's restart failed or finished.
    assert all(m["reason"] for m in snapshots if m["outcome"] != "published"), snapshots
    final = [m for m in snapshots if m["trigger"] == "preemption"]
    # A preemption attempt the trainer outran is skipped and asked for again; the last one publishes.
    assert [m["outcome"] for m in final[:-1]] == ["skipped"] * (len(final) - 1), final
    assert final[-1]["outcome"] == "published", final
    stopped_at = final[-1]["anchor_step"]
    [ended] = [e for e in read_audit(run_dir) if e.event == "run_ended"]
    assert ended.reason.startswith("preempted")
    assert ended.admission_holders == ended.deadline_holders == ended.trainer_holders == []

    restart_log = run_dir.parent / "restart.log"
    restart = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, log=restart_log)
    try:
        wait_until(lambda: train_steps(run_dir) > stopped_at, 300, "a train step after the restore", restart)
        children = psutil.Process(restart.pid).children(recursive=True)
        restart.send_signal(signal.SIGTERM)
        wait_until(lambda: "taking a final snapshot" in restart_log.read_text(), 10, "the first signal's message")
        restart.send_signal(signal.SIGTERM)
        assert restart.wait(timeout=20) == 143
        assert "exiting at once" in restart_log.read_text()
        psutil.wait_procs(children, timeout=15)
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    finally:
        if restart.poll() is None:
            restart.kill()
        stop_dev_server(server)
    [restored] = [e for e in read_audit(run_dir) if e.event == "restored"]
    assert restored.source == "snapshot" and restored.step == stopped_at
    # The newest snapshot of that step: the preemption's, or one a save_period checkpoint of the same step published
    # beside it when the signal came at that very step (both hold the run at the stop).
    at_stop = [m["snapshot_dir"] for m in snapshots if m["outcome"] == "published" and m["anchor_step"] == stopped_at]
    assert final[-1]["snapshot_dir"] in at_stop and restored.snapshot_dir == at_stop[-1], (restored, at_stop)
    assert restored.inc == 2
    [recovery] = metrics(run_dir, "recovery")
    assert recovery["source"]["kind"] == "snapshot" and recovery["restore"]["step"] == stopped_at
    assert set(recovery["seconds"]) == {"cancel_stale", "choose_source", "restore", "load_weights", "resume"}
    # Only the run's user can read what it wrote: the directory, checkpoints and snapshots. (Ray makes its own
    # folders 0777; they are inside the 0700 run directory.)
    assert run_dir.stat().st_mode & 0o777 == 0o700
    opened = [f"{oct(p.stat().st_mode & 0o777)} {p}" for p in run_dir.rglob("*")
              if p.relative_to(run_dir).parts[0] != "ray" and p.stat().st_mode & 0o077]
    assert not opened, opened


def test_sigterm_during_a_train_step_longer_than_the_grace_saves_the_finished_step_and_says_so(
        stack_config, monkeypatch) -> None:
    """A real model's step outlasts a scheduler's grace: the final save must not wait for it. The first train step is
    held on the trainer (the `train_step` fault point) far past the grace; SIGTERM then checkpoints the step before
    it under the trainer hold, publishes a snapshot of it, and the last line says so."""
    run_dir = short_run_dir("tk-slowstep-")
    log = run_dir.parent / "turnkeep.log"
    monkeypatch.setenv("TURNKEEP_CHAOS_KILL_AT", "train_step")
    monkeypatch.setenv("TURNKEEP_CHAOS_WAIT_S", "900")
    grace_s = 60
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "5", *small_run_settings(stack_config),
                    "--set", f"snapshot.preemption_grace_s={grace_s}", log=log)
    try:
        wait_until((run_dir / "chaos" / "reached").exists, 600, "the first train step on the trainer", proc)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=grace_s + 60) == 0, log.read_text()[-3000:]
        print(f"\nSIGTERM mid-step -> exit 0 in {time.monotonic() - signalled:.1f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert "turnkeep: preempted at step 0; saved snapshot" in output, output[-3000:]
    assert (run_dir / "checkpoints" / "step_0").is_dir()
    [final] = [m for m in metrics(run_dir, "snapshot") if m["trigger"] == "preemption"]
    assert final["outcome"] == "published" and final["anchor_step"] == 0, final
    [ended] = [e for e in read_audit(run_dir) if e.event == "run_ended"]
    assert ended.step == 0 and ended.trainer_holders == [], ended  # the held step never committed, its hold is gone
