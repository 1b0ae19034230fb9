"""`turnkeep chaos`: kill a training run again and again, then check the invariants.

Each round picks a target (`--target`: the whole tree, or one process alone: the
controller, the trainer, the policy server, the environment server, the Temporal
server; see `chaos_targets`) and a moment (`--at`: a random moment by default, or a
named phase, where the product waits at a hook), and SIGKILLs it. A run that died or
stopped is started again on the same run directory (a restart that recovers); a run
that repaired itself goes on to the next kill. After the last kill the run goes on to
the end undisturbed, and the audit log of all incarnations is checked against DESIGN.md's
invariants. Everything lands in `<run_dir>/chaos/` (logs, report.json).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from controller.config_file import ConfigError, load_config, parse_overrides
from controller.snapshot.periodic_attempts import PARKED_INTERVAL_S
from primitives.atomic_files import atomic_write_json
from primitives.chaos_points import ENV_POINT, ENV_WAIT, POINTS, marker_path
from primitives.process_tree import kill_tree
from schemas.config import TurnkeepConfig
from workers.chaos_invariants import Verdict, check_run_dir
from workers.chaos_targets import (
    REPAIRED_BY_THE_RUN,
    STOPS_THE_RUN,
    TARGETS,
    kill_everything,
    kill_target,
    parse_targets,
    repaired,
    sessions_cleanup,
    stop_reason,
)

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
TRAINING = "training"
"""A random moment a few seconds after a train step (no hook in the code)."""
RANDOM = "random"
"""Any moment once the incarnation trains (no hook, no step to wait for after the first)."""
ALL_POINTS = (TRAINING, *POINTS)
ALL_MOMENTS = (RANDOM, *ALL_POINTS)
FRESH_START_SKIPS = ("restore",)
"""Points a first start never reaches (it has nothing to restore), so round 1 avoids them."""
HOOK_WAIT_S = "120"
"""How long a hooked run sits at its point; far longer than the kill takes, so it never moves on."""
POLL_S = 0.1
RANDOM_MIN_DELAY_S = 0.5
"""After a train step of the incarnation, the random moment falls at least this many seconds later ..."""
RANDOM_MIN_SPAN_S = 12.0
"""... and at most `random_max_delay_s` later: two snapshot intervals, never less than this."""
TRAINING_DELAY_S = (1.0, 8.0)
AFTER_KILL_TIMEOUT_S = 240.0
"""How long a run may take to stop (trainer, policy) or to repair itself (env, temporal) after a kill."""


@dataclass
class Round:
    incarnation: int
    point: str
    outcome: str
    """`killed` (the run died with it), `timeout` (the point never came; killed anyway), `repaired` (the run
    started the process again and went on), `stopped` (the run stopped with a one-line reason), `hung` (it did
    neither in time), `missing` (the target was not running), `finished` or `crashed` (exited on its own)."""
    exit_code: int | None
    seconds: float
    processes_killed: int = 0
    log: str = ""
    target: str = "all"
    reason: str = ""
    """The run's one-line reason for stopping (`stopped`), or what went wrong."""
    after_kill_s: float | None = None
    """Seconds from the kill until the run stopped (`stopped`) or was training again (`repaired`)."""
    first_step_s: float | None = None
    """A fresh start: seconds from the start until its first train step (a restart's recovery included)."""

    @property
    def label(self) -> str:
        return f"timeout:{self.point}" if self.outcome == "timeout" else self.point


# ---- the command line ----


def add_chaos_parser(subparsers) -> argparse.ArgumentParser:
    chaos = subparsers.add_parser("chaos", help="kill a run many times at chosen points, then check the invariants")
    chaos.add_argument("--run-dir", type=Path, required=True, help="a new (or empty) run directory")
    chaos.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="TOML config (default: configs/tiny.toml)")
    chaos.add_argument("--kills", type=int, default=20, help="how many times to kill the run (default 20)")
    chaos.add_argument("--target", default="all",
                       help=f"comma list of what to kill: {', '.join(TARGETS)}, or every (default: all, the whole "
                            "process tree)")
    chaos.add_argument("--at", default=RANDOM,
                       help=f"comma list of moments: {', '.join(ALL_MOMENTS)} (default: random; the phases wait at "
                            "a hook in the product)")
    chaos.add_argument("--points", default=None, help="the older name of --at")
    chaos.add_argument("--steps", type=int, default=200, help="train steps of the whole run (default 200)")
    chaos.add_argument("--seed", type=int, help="seed of the kill schedule and timing (default: random, reported)")
    chaos.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="config override passed to every `turnkeep run`")
    chaos.add_argument("--max-delay-s", type=float, default=None,
                       help="a random moment falls 0.5 s to this many seconds after a train step (default: two "
                            "snapshot intervals of the config, at least 12), so some incarnations live to publish")
    chaos.add_argument("--phase-timeout-s", type=float, default=300.0,
                       help="give up waiting for a point after this long and kill anyway (default 300)")
    chaos.add_argument("--final-timeout-s", type=float, default=3600.0,
                       help="how long the last, undisturbed run may take to finish (default 3600)")
    return chaos


def parse_points(text: str) -> list[str]:
    points = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in points if p not in ALL_MOMENTS]
    if unknown or not points:
        raise ValueError(f"--at {text!r}: unknown {unknown}; choose from {', '.join(ALL_MOMENTS)}")
    return list(dict.fromkeys(points))


def random_max_delay_s(config: TurnkeepConfig) -> float:
    """Kills that always land before the first snapshot of an incarnation would only ever test fresh
    restores: the window spans two snapshot intervals, so some incarnations publish and some do not."""
    # Unset, a run with journaled agents takes attempts at its trainer checkpoints only; the parked default's 40 s
    # window holds about one checkpoint of the built-in task (every 20 steps, ~35 s) and is the one earlier chaos
    # runs used.
    interval = (config.snapshot.attempt_interval_s or PARKED_INTERVAL_S) if config.snapshot.enabled else 0.0
    return max(RANDOM_MIN_SPAN_S, 2.0 * interval)


def kill_schedule(targets: list[str], points: list[str], kills: int, rng: random.Random) -> list[tuple[str, str]]:
    """(target, moment) per kill: every target in turn (shuffled each cycle), each with the next moment of a
    shuffled cycle of moments, so every pair comes up over a long run."""
    moments = point_schedule(points, kills, rng)
    chosen: list[str] = []
    while len(chosen) < kills:
        cycle = list(targets)
        rng.shuffle(cycle)
        chosen += cycle
    return list(zip(chosen[:kills], moments, strict=True))


def point_schedule(points: list[str], kills: int, rng: random.Random) -> list[str]:
    """Every point once, in a shuffled order, before any repeats; reshuffled each cycle so
    a point is not always killed right after the same one."""
    schedule: list[str] = []
    while len(schedule) < kills:
        cycle = list(points)
        rng.shuffle(cycle)
        if not schedule:
            # The first start is fresh: a point it cannot reach would only burn the phase timeout.
            reachable = [i for i, p in enumerate(cycle) if p not in FRESH_START_SKIPS]
            if reachable:
                first = reachable[0]
                cycle[0], cycle[first] = cycle[first], cycle[0]
        schedule += cycle
    return schedule[:kills]


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
                steps += orjson.loads(line).get("kind") == "train_step"
            except orjson.JSONDecodeError:
                continue
    return steps


# ---- the report ----


def run_failures(rounds: list[Round], final: Round | None) -> list[str]:
    """Runs that did not end the way the chaos run expects: a crash is a bug, not a kill."""
    failures = [
        f"incarnation {r.incarnation} crashed with exit code {r.exit_code} before its kill at {r.point} (log {r.log})"
        for r in rounds if r.outcome == "crashed"
    ]
    failures += [
        f"incarnation {r.incarnation}: after the {r.target} was killed at {r.point} the run neither stopped nor "
        f"repaired itself within {r.seconds:.0f}s: {r.reason} (log {r.log})"
        for r in rounds if r.outcome == "hung"
    ]
    failures += [
        f"incarnation {r.incarnation}: the run stopped after the {r.target} was killed, without a one-line reason "
        f"(exit {r.exit_code}, log {r.log})"
        for r in rounds if r.outcome == "stopped" and not r.reason
    ]
    if final is None:
        failures.append("the final run never started")
    elif final.outcome == "timeout":
        failures.append(f"the final run did not finish within {final.seconds:.0f}s and was killed (log {final.log})")
    elif final.exit_code != 0:
        failures.append(f"the final run exited with code {final.exit_code} (log {final.log})")
    return failures


def run_warnings(rounds: list[Round], kills_requested: int) -> list[str]:
    warnings = [
        f"incarnation {r.incarnation}: {r.point} not reached within {r.seconds:.0f}s; killed anyway"
        for r in rounds if r.outcome == "timeout"
    ]
    kills = sum(r.outcome in ("killed", "timeout") for r in rounds)
    if any(r.outcome == "finished" for r in rounds):
        warnings.append(f"the run finished after {kills} of {kills_requested} kills; give it more --steps")
    return warnings


def build_report(
    *, meta: dict, rounds: list[Round], final: Round | None, verdict: Verdict, snapshot_problems: list[str],
    snapshot_checks: int,
) -> dict:
    failures = run_failures(rounds, final)
    counts = verdict.counts
    return {
        **meta,
        "rounds": [{**asdict(r), "label": r.label} for r in rounds],
        "final_run": asdict(final) if final is not None else None,
        "kills_by_point": dict(sorted(Counter(r.label for r in rounds if r.outcome in KILLED).items())),
        "kills_by_target": dict(sorted(Counter(r.target for r in rounds if r.outcome in KILLED).items())),
        "outcomes_by_target": outcomes_by_target(rounds),
        "restart_to_first_step_s": restart_times(rounds, final),
        "repair_s_by_target": {target: _median([r.after_kill_s for r in rounds if r.target == target
                                                and r.outcome == "repaired"])
                               for target in REPAIRED_BY_THE_RUN if any(r.target == target for r in rounds)},
        "restores_by_source": dict(sorted(counts.restores_by_source.items())),
        "snapshot_checks": snapshot_checks,
        "newest_snapshot_problems": list(snapshot_problems),
        "verdict": verdict.to_dict(),
        "median_restart_to_first_generation_s": counts.median_restart_to_first_generation_s,
        "tokens_regenerated": counts.tokens_regenerated,
        "tokens_generated": counts.tokens_generated,
        "tokens_regenerated_share": counts.tokens_regenerated_share,
        "tokens_discarded": counts.tokens_discarded,
        "warnings": run_warnings(rounds, meta.get("kills_requested", len(rounds))),
        "failures": failures,
        "ok": verdict.ok and not failures,
    }


KILLED = ("killed", "timeout", "repaired", "stopped", "hung")
"""Outcomes of a round whose target was killed."""


def outcomes_by_target(rounds: list[Round]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter] = {}
    for r in rounds:
        table.setdefault(r.target, Counter())[r.outcome] += 1
    return {target: dict(sorted(counts.items())) for target, counts in sorted(table.items())}


def restart_times(rounds: list[Round], final: Round | None) -> dict[str, float | None]:
    """Median seconds from a restart to its first train step, by what was killed before it."""
    by_cause: dict[str, list[float]] = {}
    starts = [*rounds, *([final] if final is not None else [])]
    for before, after in zip(starts, starts[1:]):
        if after.first_step_s is not None and before.outcome in ("killed", "timeout", "stopped"):
            by_cause.setdefault(before.target, []).append(after.first_step_s)
    return {target: _median(times) for target, times in sorted(by_cause.items())}


def _median(values: list[float | None]) -> float | None:
    present = sorted(v for v in values if v is not None)
    return round(present[len(present) // 2], 2) if present else None


def format_report(report: dict, verdict: Verdict) -> str:
    def listing(counts: dict) -> str:
        return ", ".join(f"{key} {n}" for key, n in counts.items()) or "none"

    final = report["final_run"]
    lines = [
        f"turnkeep chaos: {report.get('run_dir', '')} (seed {report.get('seed')})",
        f"kills by point: {listing(report['kills_by_point'])}",
        f"kills by target: {listing(report.get('kills_by_target', {}))}",
    ]
    lines += [f"  {target}: {listing(outcomes)}" for target, outcomes in report.get("outcomes_by_target", {}).items()]
    if report.get("restart_to_first_step_s"):
        lines.append("restart -> first train step (median s), by what was killed: "
                     + listing(report["restart_to_first_step_s"]))
    if report.get("repair_s_by_target"):
        lines.append("kill -> training again without a restart (median s): " + listing(report["repair_s_by_target"]))
    lines += [
        f"incarnation {r['incarnation']} {r['outcome']} on its own (exit {r['exit_code']}) before its kill at {r['point']}"
        for r in report["rounds"] if r["outcome"] in ("finished", "crashed")
    ]
    if final is not None:
        lines.append(f"final run: {final['outcome']}, exit {final['exit_code']} after {final['seconds']:.0f}s")
    lines += [
        f"newest published snapshot checked after {report['snapshot_checks']} kills: "
        f"{len(report['newest_snapshot_problems'])} broken",
        "",
        verdict.format(),  # restores by source, restart -> first generation and regenerated tokens are in it
        "",
    ]
    lines += [f"warning: {w}" for w in report["warnings"]]
    lines += [f"RUN FAILED: {f}" for f in report["failures"]]
    lines.append("chaos: PASS" if report["ok"] else "chaos: FAIL")
    return "\n".join(lines)


# ---- driving the runs ----


def run_chaos(args) -> int:
    run_dir = Path(args.run_dir).resolve()
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        print(f"turnkeep chaos: {run_dir} exists and is not empty; nothing in it was touched", file=sys.stderr)
        return 2
    try:
        points = parse_points(args.points or args.at)
        targets = parse_targets(args.target)
    except ValueError as err:
        print(f"turnkeep chaos: {err}", file=sys.stderr)
        return 2
    config = Path(args.config).resolve()
    if not config.is_file():
        print(f"turnkeep chaos: no config file at {config}", file=sys.stderr)
        return 2
    try:
        max_delay_s = _max_delay_s(args, config)
    except ConfigError as err:
        print(f"turnkeep chaos: {err}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    schedule = kill_schedule(targets, points, args.kills, rng)
    command = [sys.executable, "-m", "workers.cli", "run", "--config", str(config), "--run-dir", str(run_dir),
               "--steps", str(args.steps), *[arg for pair in args.set for arg in ("--set", pair)]]
    print(f"turnkeep chaos: {args.kills} kills of {run_dir} (seed {seed}): "
          f"{', '.join(f'{target}@{point}' for target, point in schedule)}; random moments {RANDOM_MIN_DELAY_S}-"
          f"{max_delay_s:.0f}s after a train step", flush=True)

    rounds: list[Round] = []
    problems: list[str] = []
    checks = 0
    sessions: list[int] = []
    current: _Incarnation | None = None
    try:
        for target, point in schedule:
            if current is None:
                current = _Incarnation(command, run_dir, len(sessions) + 1, point)
                sessions.append(current.proc.pid)
            elif point in POINTS:
                point = RANDOM  # a running incarnation's hooks are armed only at its start
            record = _one_round(current, run_dir, target, point, args.phase_timeout_s, rng, max_delay_s)
            rounds.append(record)
            print(f"turnkeep chaos: incarnation {record.incarnation}: {record.target} {record.outcome} at "
                  f"{record.label} after {record.seconds:.0f}s{f' ({record.reason})' if record.reason else ''}",
                  flush=True)
            if current.proc.poll() is not None:
                current.close()
                current = None
            if record.outcome == "finished":
                break  # nothing left to kill: the run reached its last step
            if record.outcome in ("killed", "timeout", "stopped"):
                checks += 1
                problem = newest_snapshot_problem(run_dir)
                if problem is not None:
                    problems.append(f"after the kill of incarnation {record.incarnation} at {record.label}: {problem}")
                    print(f"turnkeep chaos: NEWEST SNAPSHOT BROKEN: {problems[-1]}", flush=True)
        if current is None:
            current = _Incarnation(command, run_dir, len(sessions) + 1, None)
            sessions.append(current.proc.pid)
        final = _final_round(current, args.final_timeout_s)
    finally:
        if current is not None:
            current.close()
        sessions_cleanup(sessions)
        kill_everything(run_dir, None)

    verdict = check_run_dir(run_dir, newest_snapshot_problems=problems, snapshot_checks=checks)
    meta = {"run_dir": str(run_dir), "config": str(config), "steps": args.steps, "seed": seed,
            "kills_requested": args.kills, "max_delay_s": max_delay_s, "points": points, "targets": targets, "sets": list(args.set)}
    report = build_report(meta=meta, rounds=rounds, final=final, verdict=verdict, snapshot_problems=problems,
                          snapshot_checks=checks)
    atomic_write_json(run_dir / "chaos" / "report.json", report)
    print(format_report(report, verdict))
    print(f"report: {run_dir / 'chaos' / 'report.json'}")
    return 0 if report["ok"] else 1


def newest_snapshot_problem(run_dir: Path) -> str | None:
    """What is wrong with the newest published snapshot, in words (None: intact or none yet)."""
    from controller.fingerprint import config_fingerprint
    from controller.restore.restore_source import newest_published_problem
    from schemas.config import TurnkeepConfig

    run_json, config_json = run_dir / "run.json", run_dir / "config.json"
    if not (run_json.exists() and config_json.exists()):
        return None  # killed before the run claimed its directory: nothing was published
    run_id = orjson.loads(run_json.read_bytes())["run_id"]
    fingerprint = config_fingerprint(TurnkeepConfig.model_validate_json(config_json.read_bytes()))
    problem = newest_published_problem(run_dir, run_id, fingerprint)
    return None if problem is None else f"{problem.path}: {problem.problem} ({problem.detail})"


class _Incarnation:
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


def _max_delay_s(args, config: Path) -> float:
    if args.max_delay_s is not None:
        if args.max_delay_s <= RANDOM_MIN_DELAY_S:
            raise ConfigError(f"--max-delay-s {args.max_delay_s}: must be more than {RANDOM_MIN_DELAY_S} s")
        return args.max_delay_s
    return random_max_delay_s(load_config(config, parse_overrides(args.set)))


def _one_round(current: _Incarnation, run_dir: Path, target: str, point: str, timeout_s: float,
               rng: random.Random, max_delay_s: float) -> Round:
    started = time.monotonic()
    fresh_first_step = current.first_step_s is None
    moment = _wait_for_kill_moment(current, point, timeout_s, rng, max_delay_s)

    def record(outcome: str, killed: int = 0, reason: str = "", after_kill_s: float | None = None) -> Round:
        current.log.settle()
        return Round(current.number, point, outcome, current.proc.poll(), round(time.monotonic() - started, 2),
                     killed, str(current.log.path), target, reason, after_kill_s,
                     current.first_step_s if fresh_first_step else None)

    if moment == "exited":
        code = current.proc.wait()
        return record("finished" if code == 0 else "crashed")
    kill = kill_target(target, run_dir, current.proc.pid)
    killed_at = time.monotonic()
    if kill.killed == 0:
        return record("missing", reason=f"no live {target} process was found in {run_dir / 'pids'}")
    if target in ("all", "controller"):
        current.proc.wait()
        return record("killed" if moment == "reached" else "timeout", kill.killed)
    steps_at_kill = current.steps()
    deadline = killed_at + AFTER_KILL_TIMEOUT_S
    while time.monotonic() < deadline:
        current.log.settle()
        if current.proc.poll() is not None:
            reason = stop_reason(current.log.path)
            return record("stopped", kill.killed, reason, round(time.monotonic() - killed_at, 2))
        if target in REPAIRED_BY_THE_RUN and repaired(run_dir, target, kill.pid) and current.steps() > steps_at_kill:
            return record("repaired", kill.killed, after_kill_s=round(time.monotonic() - killed_at, 2))
        time.sleep(POLL_S)
    expected = "stop with a reason" if target in STOPS_THE_RUN else "start it again and train"
    kill_everything(run_dir, current.proc.pid)
    current.proc.wait()
    return record("hung", kill.killed, f"it did not {expected} within {AFTER_KILL_TIMEOUT_S:.0f}s")


def _final_round(current: _Incarnation, timeout_s: float) -> Round:
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


def _wait_for_kill_moment(current: _Incarnation, point: str, timeout_s: float, rng: random.Random,
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
