"""A hung process heals like a dead one, in real runs of the tiny model, each frozen (SIGSTOP) at a pinned moment:

- the vLLM engine core of the one engine, after step 2, so its front end still answers HTTP while no token comes.
  The engine keeper's liveness probe (a one-token request straight to the engine core, `policy.hang_s`) notices
  it, the engine's processes are killed by pid (the stopped core included), a replacement takes the turns, the run
  reaches its last step, nothing is trained twice, and the hang is one metrics line naming its probe;
- trainer rank 1 of 2, once a snapshot is published: rank 0's next collective times out (`train.hang_s`), the
  trainer kills the frozen rank by pid and exits, and the run rebuilds the group, restores into it and trains on."""

from __future__ import annotations

import os
import signal

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
from turnkeep.chaos.targets import engine_cores
from turnkeep.chaos.verdict import check_run_dir
from turnkeep.primitives.audit_log import read_audit
from turnkeep.primitives.pid_files import live_pid

pytestmark = pytest.mark.integration
HANG_S = 10


def test_a_frozen_engine_core_is_noticed_killed_and_replaced(stack_config) -> None:
    run_dir = short_run_dir("tk-hang-")
    log = run_dir.parent / "run.log"
    run = turnkeep("run", *small_run_settings(stack_config), "--set", f"run.run_dir={run_dir}", "--set",
                   "run.steps=10", "--set", f"policy.hang_s={HANG_S}", log=log)
    wait_until(lambda: train_steps(run_dir) >= 2, 600, "two train steps", run)
    [core] = engine_cores(live_pid(run_dir, "policy"))
    os.kill(core.pid, signal.SIGSTOP)
    assert run.wait(timeout=600) == 0, log.read_text()[-4000:]
    assert not core.is_running() or core.status() == psutil.STATUS_ZOMBIE  # killed, not left stopped
    [hang] = metrics(run_dir, "hang")
    assert (hang["target"], hang["probe"], hang["hang_s"]) == ("engine 0", "engine core token", HANG_S)
    [restart] = metrics(run_dir, "engine_restart")
    assert restart["engine"] == 0 and restart["t"] > hang["t"]
    assert [line["step"] for line in metrics(run_dir, "train_step")] == list(range(1, 11))
    assert "policy engine 0 (" in log.read_text() and "hung: its engine core generated no token" in log.read_text()
    verdict = check_run_dir(run_dir)
    assert verdict.ok, verdict.format()


def test_a_frozen_trainer_rank_times_out_its_group_is_killed_by_pid_and_rebuilt(stack_config) -> None:
    run_dir = short_run_dir("tk-hang-rank-")
    log = run_dir.parent / "run.log"
    run = turnkeep("run", *small_run_settings(stack_config), "--set", f"run.run_dir={run_dir}", "--set",
                   "run.steps=12", "--set", "train.ranks=2", "--set", f"train.hang_s={HANG_S}", log=log)
    published = lambda: any(m["outcome"] == "published" for m in metrics(run_dir, "snapshot"))  # noqa: E731
    wait_until(lambda: (run_dir / "metrics.jsonl").exists() and published() and train_steps(run_dir) >= 5, 600,
               "a published snapshot and five train steps", run)
    rank = psutil.Process(live_pid(run_dir, "trainer.rank1"))
    rank.send_signal(signal.SIGSTOP)
    assert run.wait(timeout=600) == 0, log.read_text()[-4000:]
    assert not rank.is_running() or rank.status() == psutil.STATUS_ZOMBIE  # killed, not left stopped
    [rebuild] = metrics(run_dir, "trainer_rebuild")
    assert rebuild["rebuild_in_a_row"] == 1
    [hang] = metrics(run_dir, "hang")
    assert (hang["target"], hang["hang_s"]) == ("trainer ranks", HANG_S)
    # Frozen inside a collective, rank 0's times out; frozen after its last one, rank 1 never answers the call.
    assert hang["probe"] in ("collective timeout", "no answer"), hang
    assert "rank process(es) killed by pid" in ray_worker_logs(run_dir) + log.read_text()
    assert metrics(run_dir, "train_step")[-1]["step"] == 12
    # The new group loaded the ranks' copies of the step the frozen one reached: the restore undid no step.
    [restored] = [event for event in read_audit(run_dir) if event.event == "restored"]
    assert restored.kept_after_cut is not None and restored.kept_after_cut.undone_steps == [], restored
    assert "the new trainer's 2 rank(s) loaded their shards' copies of train step" in log.read_text()
    verdict = check_run_dir(run_dir)
    assert verdict.ok, verdict.format()
