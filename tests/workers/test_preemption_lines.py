"""The last line of a preempted run names what its final snapshot kept of the running agents, in its mode's words."""

from __future__ import annotations

from turnkeep.schemas.choices import Outcome, Trigger
from turnkeep.schemas.snapshot import SnapshotAttemptResult
from turnkeep.workers.preemption import saved_agents


def _result(**counts) -> SnapshotAttemptResult:
    return SnapshotAttemptResult(checkpoint_id="r.snapshot.12.1", outcome=Outcome.PUBLISHED, reason="published",
                                 anchor_step=12, trigger=Trigger.PREEMPTION, **counts)


def test_a_journal_snapshot_names_the_agents_kept_in_the_journals_not_zero_parked() -> None:
    line = saved_agents(_result(journaled_agents=125))
    assert line == "step 12, 125 running agents kept in the turn journals" and "parked" not in line


def test_a_parked_snapshot_names_its_parked_agents_and_an_empty_one_says_so() -> None:
    assert saved_agents(_result(parked_agents=7)) == "step 12, 7 parked agents"
    assert saved_agents(_result()) == "step 12, no running agents to keep"


# A preempted run whose processes hang on their way out (a vLLM or Ray stop that does not return).
SLOW_SHUTDOWN = """
import pathlib, subprocess, sys, time, types
sys.path.insert(0, sys.argv[1])
from turnkeep.workers import preemption
preemption.SHUTDOWN_AFTER_SAVE_S = 0.5
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
controller = types.SimpleNamespace(cfg=types.SimpleNamespace(run=types.SimpleNamespace(run_dir=pathlib.Path(sys.argv[2]))))
handler = preemption.PreemptionHandler(controller, None, 10.0)
handler.saved = "snapshot checkpoints/step_12/snapshots/s (step 12, 3 parked agents, 8 finished rows)"
handler.exit_soon(12)
time.sleep(60)
"""


def test_a_preempted_run_whose_processes_hang_on_the_way_out_exits_0_soon_with_its_last_line(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    import psutil

    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", SLOW_SHUTDOWN, root, str(tmp_path)], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    child_pid, *lines = proc.stdout.split("\n")
    assert "turnkeep: preempted at step 12; saved snapshot checkpoints/step_12" in proc.stdout
    assert "did not stop within 0.5s of the save and were killed" in proc.stdout
    assert not psutil.pid_exists(int(child_pid)) or psutil.Process(int(child_pid)).status() == psutil.STATUS_ZOMBIE


def test_a_save_that_saved_nothing_says_where_the_next_start_begins(tmp_path) -> None:
    from turnkeep.workers.preemption import next_start, preempted_line

    line = preempted_line(3, f"nothing (within snapshot.preemption_grace_s = 60s); {next_start(tmp_path)}")
    assert line.startswith("turnkeep: preempted at step 3; saved nothing (within") and "begins at step 0" in line
    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)
    (tmp_path / "checkpoints" / ".staging-step_4-ab12").mkdir()  # never read as a checkpoint
    assert "begins at step 2 (trainer checkpoint step_2" in next_start(tmp_path)
