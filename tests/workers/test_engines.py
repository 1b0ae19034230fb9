"""Two vLLM engines in one run, for real: turns spread over both, a parked snapshot fences both, one killed from
outside costs only the turns it was generating (they go to the other engine; no rollout is retried), its
replacement is refitted and takes turns again, `turnkeep scale` takes the run to one engine and back while it
trains, and the same command restores a crashed run into both engines.
One run serves every check (a start costs more than any of them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.run_command import metrics, short_run_dir, small_run_settings, train_steps, turnkeep, wait_until
from turnkeep.chaos.targets import kill_everything
from turnkeep.controller.engines.scaled_count import SCALED_FILE
from turnkeep.primitives.pid_files import live_pid

pytestmark = pytest.mark.integration

ENGINES = ["--set", "policy.engines=2", "--set", "snapshot.agents=parked", "--set", "policy.engine_restart_s=1"]


def _published(run_dir) -> list[dict]:
    if not (run_dir / "metrics.jsonl").exists():
        return []
    return [m for m in metrics(run_dir, "snapshot") if m["outcome"] == "published"]


def _last_step(run_dir) -> dict:
    return metrics(run_dir, "train_step")[-1]


def _scale(run_dir, engines: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turnkeep", "scale", "--run-dir", str(run_dir), "--engines",
                           str(engines)], capture_output=True, text=True, timeout=600)


def _scale_down_refuse_and_up_again(run_dir, proc) -> None:
    """2 -> 1 -> 2 while training, through the run workflow's update; a bad count is refused with its reason."""
    down = _scale(run_dir, 1)
    assert down.returncode == 0 and "retired [1]" in down.stdout, down.stdout + down.stderr
    # Kept for the run's next start (tests/controller/engines/test_scaled_count.py: what a start does with it).
    assert json.loads((run_dir / SCALED_FILE).read_text()) == {"engines": 1, "config_engines": 2}
    steps = train_steps(run_dir)
    wait_until(lambda: train_steps(run_dir) >= steps + 2, 300, "training on one engine", proc)
    assert _last_step(run_dir)["engines_live"] == 1 and set(_last_step(run_dir)["engine_tokens_per_s"]) == {"0"}
    refused = _scale(run_dir, 0)
    assert refused.returncode == 2 and "refused: no policy engines" in refused.stderr, refused.stderr
    up = _scale(run_dir, 2)
    assert up.returncode == 0 and "started [1]" in up.stdout, up.stdout + up.stderr
    assert json.loads((run_dir / SCALED_FILE).read_text())["engines"] == 2
    steps = train_steps(run_dir)
    wait_until(lambda: train_steps(run_dir) >= steps + 2, 300, "training on two engines again", proc)
    assert _last_step(run_dir)["engines_live"] == 2


def test_two_engines_share_the_turns_survive_a_kill_and_restore_together(stack_config) -> None:
    run_dir = short_run_dir("tk-engines-")
    log = run_dir.parent / "turnkeep.log"
    settings = [*small_run_settings(stack_config), *ENGINES]
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, log=log)
    try:
        wait_until(lambda: _published(run_dir) and train_steps(run_dir) >= 3, 420, "training and a snapshot", proc)
        step = _last_step(run_dir)
        assert step["engines_live"] == 2, step
        # Both engines generate (fewest outstanding calls first); each turn still names its policy version.
        assert set(step["engine_tokens_per_s"]) == {"0", "1"}, step
        assert all(rate > 0 for rate in step["engine_tokens_per_s"].values()), step
        # Each engine committed its own state into the published snapshot (the attempt fanned out to both).
        states = {path.parent.name for path in run_dir.glob("checkpoints/*/snapshots/*/policy.*/state.json")}
        assert states == {"policy.0", "policy.1"}, sorted(run_dir.rglob("state.json"))

        killed = live_pid(run_dir, "policy.1")
        steps_at_kill, published_at_kill = train_steps(run_dir), len(_published(run_dir))
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: live_pid(run_dir, "policy.1") not in (None, killed), 240, "a replacement engine", proc)
        wait_until(lambda: metrics(run_dir, "engine_restart"), 240, "the replacement to take turns", proc)
        wait_until(lambda: train_steps(run_dir) >= steps_at_kill + 3 and len(_published(run_dir)) > published_at_kill,
                   420, "training and a parked snapshot of both engines after the kill", proc)
        # Its interrupted turns went to engine 0 inside their policy calls: no rollout was retried, no step undone.
        assert _last_step(run_dir)["retries_total"] == 0, _last_step(run_dir)
        _scale_down_refuse_and_up_again(run_dir, proc)
    finally:
        if proc.poll() is None:
            kill_everything(run_dir, proc.pid)
            proc.wait(timeout=60)
    text = log.read_text()
    [restart] = metrics(run_dir, "engine_restart")
    print(f"\nengine 1 replaced and taking turns {restart['seconds']:.1f} s after its death")
    assert restart["engine"] == 1
    assert "policy engine 1" in text and "died" in text, text[-3000:]
    assert _last_step(run_dir)["engines_live"] == 2

    # The whole tree crashed; the same command restores into both engines and trains on.
    steps = train_steps(run_dir)
    again_log = run_dir.parent / "again.log"
    again = turnkeep("run", "--run-dir", str(run_dir), "--steps", str(steps + 2), *settings, log=again_log)
    try:
        assert again.wait(timeout=600) == 0, again_log.read_text()[-3000:]
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
    assert "turnkeep: restored from" in again_log.read_text()
    after = _last_step(run_dir)
    assert after["step"] == steps + 2 and after["engines_live"] == 2
    assert all(rate > 0 for rate in after["engine_tokens_per_s"].values()), after

