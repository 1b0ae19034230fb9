"""Run `turnkeep` as a separate process tree, the way a user or a scheduler does."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from turnkeep.chaos.incarnation import count_train_steps
from turnkeep.chaos.targets import kill_everything
from turnkeep.schemas.config import TurnkeepConfig


def small_run_settings(cfg: TurnkeepConfig) -> list[str]:
    """`--set` flags for the test stack's small model and shapes, on free Temporal ports."""
    settings = {
        "model.cache_dir": str(cfg.model.cache_dir),
        "model.tiny.warm_start_steps": cfg.model.tiny.warm_start_steps,
        "rollout.group_size": cfg.rollout.group_size,
        "train.prompts_per_step": cfg.train.prompts_per_step,
        "train.save_period": 4,
        "snapshot.attempt_interval_s": 5,
        "env.tool_latency_s": 0.1,
        "temporal.port": 0,
        "temporal.ui_port": 0,
    }
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


EVERY_KIND = '{"calc": {"kind": "calc"}, "workspace": {"kind": "workspace"}, "lab": {"kind": "lab"}, ' \
             '"judge": {"kind": "judge"}}'
"""`--set environments=...` for a run of every built-in kind at once (their rollouts last unlike lengths)."""

RUN_DIRS: list[Path] = []
"""Every run directory a test made: what is left running in them is killed after the test (`kill_leftovers`)."""


def short_run_dir(prefix: str) -> Path:
    # Ray's socket paths must stay short.
    run_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")) / "run"
    RUN_DIRS.append(run_dir)
    return run_dir


def deep_run_dir(prefix: str) -> Path:
    """A run directory as deep as users keep theirs: too deep for Ray's sockets under `<run_dir>/ray`."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")) / "experiments" / "2026-12" / "lookup-sweep" / "run"
    run_dir.parent.mkdir(parents=True)
    RUN_DIRS.append(run_dir)
    return run_dir


def kill_leftovers() -> int:
    """A test that SIGKILLs a controller leaves the run's Ray (its own session) waiting for a new one: kill it."""
    killed = 0
    while RUN_DIRS:
        killed += kill_everything(RUN_DIRS.pop(), None)
    return killed


INTEGRATION_TEST = False
"""Set for each test by tests/conftest.py: whether it is marked `integration`."""


def turnkeep(*args: str, log: Path) -> subprocess.Popen:
    assert INTEGRATION_TEST, "a test that starts `turnkeep` (real Ray, vLLM, Temporal) is marked integration"
    out = open(log, "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "turnkeep", *args], stdout=out, stderr=subprocess.STDOUT,
        start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def passing_chaos_run(prefix: str, *args: str, timeout_s: float = 1500) -> tuple[Path, dict]:
    """`turnkeep chaos --run-dir <new> *args`; asserts it exited 0 with `chaos: PASS`; the run directory and its
    report."""
    run_dir = short_run_dir(prefix)
    log = run_dir.parent / "chaos.log"
    code = turnkeep("chaos", "--run-dir", str(run_dir), *args, log=log).wait(timeout=timeout_s)
    output = log.read_text()
    assert code == 0, output[-4000:]
    assert "chaos: PASS" in output
    return run_dir, orjson.loads((run_dir / "chaos" / "report.json").read_bytes())


def train_steps(run_dir: Path) -> int:
    return count_train_steps(run_dir / "metrics.jsonl")


def metrics(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_bytes().splitlines()
    return [row for row in map(orjson.loads, lines) if row.get("kind") == kind]


def ray_worker_logs(run_dir: Path) -> str:
    """What the run's Ray workers wrote to stderr, from the session's files in the run directory. A line a worker
    logs just before it exits may never be forwarded to the run's own output (Ray's log monitor forwards by polling,
    and the worker is gone first); its file has it whatever the moment."""
    return "\n".join(path.read_text(errors="replace") for path in sorted((run_dir / "ray").rglob("worker-*.err")))


def wait_until(predicate, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"turnkeep exited with {proc.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.5)
