"""One `turnkeep run` process of a chaos run: started (armed at a hook, or not), waited on until
its kill moment, killed where the schedule says, and watched until it stops, repairs itself
or hangs. Its output goes to `<run_dir>/chaos/incarnation-<n>.log`."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import orjson

from turnkeep.chaos.local_cluster import LocalCluster
from turnkeep.chaos.report import Round
from turnkeep.chaos.schedule import RANDOM, RANDOM_MIN_DELAY_S, TRAINING
from turnkeep.chaos.targets import (
    ENDS_THE_INCARNATION,
    FREEZE_CONTROLLER,
    REPAIRED_BY_THE_RUN,
    kill_everything,
    kill_target,
    repaired,
    stop_reason,
)
from turnkeep.primitives.chaos_points import ENV_POINT, ENV_WAIT, POINTS, marker_path
from turnkeep.primitives.process_tree import kill_tree
from turnkeep.schemas.choices import MetricsKind

HOOK_WAIT_S = "120"
"""How long a hooked run sits at its point; far longer than the kill takes, so it never moves on."""
POLL_S = 0.1
TRAINING_DELAY_S = (1.0, 8.0)
AFTER_KILL_TIMEOUT_S = 240.0
"""How long a run may take to repair itself (a new trainer group, engine, environment server, Temporal) after a
kill, or to stop with its one line."""


def count_train_steps(metrics_path: Path) -> int:
    """Train-step lines in metrics.jsonl so far (a torn last line is not a step yet)."""
    try:
        data = metrics_path.read_bytes()
    except FileNotFoundError:
        return 0
    steps = 0
    for line in data.splitlines(keepends=True):
        if line.endswith(b"\n") and b'"train_step"' in line:
            try:
                steps += orjson.loads(line).get("kind") == MetricsKind.TRAIN_STEP
            except orjson.JSONDecodeError:
                continue
    return steps


class Incarnation:
    """One `turnkeep run` process, from its start until it exits (it may outlive several kills)."""

    def __init__(self, command: list[str], run_dir: Path, number: int, point: str | None) -> None:
        marker_path(run_dir).unlink(missing_ok=True)
        self.number = number
        self.run_dir = run_dir
        self.log = _IncarnationLog(run_dir, number)
        self.started = time.monotonic()
        self.steps_at_start = count_train_steps(run_dir / "metrics.jsonl")
        self.first_step_s: float | None = None
        self.proc = _start(command, point, self.log)

    def steps(self) -> int:
        steps = count_train_steps(self.run_dir / "metrics.jsonl")
        self.steps_at_start = min(self.steps_at_start, steps)  # a restart may rewrite the file shorter
        if self.first_step_s is None and steps > self.steps_at_start:
            self.first_step_s = round(time.monotonic() - self.started, 2)
        return steps

    def close(self) -> None:
        _stop(self.proc)
        self.log.settle()


def one_round(current: Incarnation, run_dir: Path, target: str, point: str, timeout_s: float,
              rng: random.Random, max_delay_s: float, cluster: LocalCluster | None = None) -> Round:
    started = time.monotonic()
    fresh_first_step = current.first_step_s is None
    moment = _wait_for_kill_moment(current, point, timeout_s, rng, max_delay_s)

    lost: list[str] = []
    lost_urls: dict[str, str] = {}
    at_unix_s: list[float] = []

    def record(outcome: str, killed: int = 0, reason: str = "", after_kill_s: float | None = None) -> Round:
        current.log.settle()
        return Round(current.number, point, outcome, current.proc.poll(), round(time.monotonic() - started, 2),
                     killed, str(current.log.path), target, reason, after_kill_s,
                     current.first_step_s if fresh_first_step else None, lost, lost_urls,
                     round(at_unix_s[0], 3) if at_unix_s else None)

    if moment == "exited":
        code = current.proc.wait()
        return record("finished" if code == 0 else "crashed")
    at_unix_s.append(time.time())
    kill = kill_target(target, run_dir, current.proc.pid, rng, cluster)
    killed_at = time.monotonic()
    lost += sorted(kill.lost)
    lost_urls.update(kill.lost_urls)
    if kill.killed == 0:
        return record("missing", reason=f"no live {target} process was found in {run_dir / 'pids'}")
    if target in ENDS_THE_INCARNATION:
        try:  # a frozen controller ends when the run's keeper kills it
            current.proc.wait(timeout=None if target != FREEZE_CONTROLLER else AFTER_KILL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_everything(run_dir, current.proc.pid)
            current.proc.wait()
            return record("hung", kill.killed, f"nothing killed the frozen controller within "
                                               f"{AFTER_KILL_TIMEOUT_S:.0f}s")
        return record("killed" if moment == "reached" else "timeout", kill.killed)
    steps_at_kill = current.steps()
    deadline = killed_at + AFTER_KILL_TIMEOUT_S
    while time.monotonic() < deadline:
        current.log.settle()
        if current.proc.poll() == 0:  # it reached its last step before it was training again
            return record("finished", kill.killed, after_kill_s=round(time.monotonic() - killed_at, 2))
        if current.proc.poll() is not None:
            reason = stop_reason(current.log.path)
            return record("stopped", kill.killed, reason, round(time.monotonic() - killed_at, 2))
        if (target in REPAIRED_BY_THE_RUN and repaired(run_dir, kill)
                and current.steps() > steps_at_kill):
            return record("repaired", kill.killed, after_kill_s=round(time.monotonic() - killed_at, 2))
        time.sleep(POLL_S)
    kill_everything(run_dir, current.proc.pid)
    current.proc.wait()
    return record("hung", kill.killed,
                  f"it did not replace the {target} and train again within {AFTER_KILL_TIMEOUT_S:.0f}s")


def final_round(current: Incarnation, timeout_s: float) -> Round:
    started = time.monotonic()
    fresh_first_step = current.first_step_s is None
    deadline = started + timeout_s
    while current.proc.poll() is None and time.monotonic() < deadline:
        current.log.settle()
        current.steps()
        time.sleep(1.0)
    timed_out = current.proc.poll() is None
    killed = kill_tree(current.proc.pid) if timed_out else 0
    code = current.proc.wait()
    current.log.settle()
    outcome = "timeout" if timed_out else ("finished" if code == 0 else "crashed")
    return Round(current.number, "none", outcome, code, round(time.monotonic() - started, 2), killed,
                 str(current.log.path), first_step_s=current.first_step_s if fresh_first_step else None)


class _IncarnationLog:
    """`<run_dir>/chaos/incarnation-<n>.log`. The first run cannot start with anything inside
    its run directory (a non-empty directory that is not a run is refused), so its log is
    written beside the directory and moved in once the run has claimed it (`run.json`)."""

    def __init__(self, run_dir: Path, number: int) -> None:
        self.run_dir = run_dir
        self.final = run_dir / "chaos" / f"incarnation-{number}.log"
        if self._claimed():
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self.path = self.final
        else:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            self.path = run_dir.parent / f".{run_dir.name}.chaos-incarnation-{number}.log"

    def _claimed(self) -> bool:
        return (self.run_dir / "run.json").exists()

    def settle(self) -> None:
        # The open descriptor follows the file across the rename, so the child keeps writing to it.
        # A run that died before claiming the directory leaves its log beside it: creating
        # `chaos/` there would make the next start refuse the directory.
        if self.path != self.final and self._claimed():
            self.final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.path, self.final)
            self.path = self.final


def _start(command: list[str], point: str | None, log: _IncarnationLog) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop(ENV_POINT, None)
    if point in POINTS:
        env[ENV_POINT] = point
        env.setdefault(ENV_WAIT, HOOK_WAIT_S)
    with open(log.path, "ab") as out:
        # Its own session, so the kill can take the whole tree, re-parented daemons included.
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def _wait_for_kill_moment(current: Incarnation, point: str, timeout_s: float, rng: random.Random,
                          max_delay_s: float) -> str:
    """`reached`, `timeout` or `exited` (the run ended on its own first)."""
    deadline = time.monotonic() + timeout_s
    steps_seen = current.steps()  # earlier incarnations' (and earlier rounds') steps are not new
    marker = marker_path(current.run_dir)
    while time.monotonic() < deadline:
        current.log.settle()
        if current.proc.poll() is not None:
            return "exited"
        if point in (TRAINING, RANDOM):
            if current.steps() > steps_seen:
                # Somewhere after a step: mid-generation, mid-backward, mid-refit or mid-attempt.
                low, high = TRAINING_DELAY_S if point == TRAINING else (RANDOM_MIN_DELAY_S, max_delay_s)
                pause_until = time.monotonic() + rng.uniform(low, high)
                while time.monotonic() < pause_until:
                    if current.proc.poll() is not None:
                        return "exited"
                    time.sleep(POLL_S)
                return "reached"
        elif marker.exists():
            return "reached"
        time.sleep(POLL_S)
    return "timeout"


def _stop(proc: subprocess.Popen) -> None:
    """On any way out (Ctrl-C included), leave no run behind."""
    if proc.poll() is None:
        kill_tree(proc.pid)
        proc.wait()
