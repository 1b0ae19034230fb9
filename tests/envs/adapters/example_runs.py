"""The adapters' integration tests: an ecosystem's example trained for a few steps by `turnkeep run`."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.run_command import metrics, short_run_dir, small_run_settings, turnkeep
from turnkeep.chaos.verdict import check_run_dir


def train_example(stack_config, config: Path, prefix: str, *settings: str, timeout_s: float = 600) -> Path:
    """Train `config` 3 steps at the test stack's sizes; asserts the steps happened and every invariant holds."""
    run_dir = short_run_dir(prefix)
    log = run_dir.parent / "turnkeep.log"
    proc = turnkeep("run", "--config", str(config), "--run-dir", str(run_dir), "--steps", "3",
                    *small_run_settings(stack_config), *settings, log=log)
    try:
        assert proc.wait(timeout=timeout_s) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    steps = metrics(run_dir, "train_step")
    assert [m["step"] for m in steps] == [1, 2, 3] and all(0.0 <= m["reward_mean"] <= 1.0 for m in steps)
    verdict = check_run_dir(run_dir)
    assert verdict.ok, verdict.format()
    return run_dir
