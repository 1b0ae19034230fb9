"""`turnkeep chaos`: kill a training run again and again, then check the invariants.

Each round picks a target (`--target`: the whole tree, or one process alone: the
controller, the trainer, the policy server, the environment server, the Temporal
server; see `chaos/targets.py`) and a moment (`--at`: a random moment by default, or a
named phase, where the product waits at a hook), and SIGKILLs it. A run that died or
stopped is started again on the same run directory (a restart that recovers); a run
that repaired itself goes on to the next kill. After the last kill the run goes on to
the end undisturbed, and the audit log of all incarnations is checked against DESIGN.md's
invariants. Everything lands in `<run_dir>/chaos/` (logs, report.json).
"""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

from turnkeep.chaos.incarnation import Incarnation, final_round, one_round
from turnkeep.chaos.local_cluster import HEAD_IP, WORKER_IP, ClusterError, LocalCluster
from turnkeep.chaos.recheck import recheck
from turnkeep.chaos.report import Round, build_report, format_report
from turnkeep.chaos.schedule import RANDOM, RANDOM_MIN_DELAY_S, kill_schedule, parse_points, random_max_delay_s
from turnkeep.chaos.targets import NODE, kill_everything, parse_targets, sessions_cleanup
from turnkeep.chaos.verdict import check_run_dir
from turnkeep.config.loader import ConfigError, load_config, parse_overrides
from turnkeep.primitives.atomic_files import atomic_write_json
from turnkeep.primitives.chaos_points import POINTS


class _Refused(Exception):
    """A chaos run that starts no incarnation: the one line that says why, and the exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class _Plan:
    """What a chaos run was asked for, checked before anything starts."""

    run_dir: Path
    config: Path
    points: list[str]
    targets: list[str]
    max_delay_s: float


def run_chaos(args) -> int:
    run_dir = Path(args.run_dir).resolve()
    if args.recheck:
        return recheck(run_dir)
    try:
        plan = _checked_plan(args, run_dir)
        seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
        rng = random.Random(seed)
        schedule = kill_schedule(plan.targets, plan.points, args.kills, rng)
        cluster = _started_cluster(plan.targets)
    except _Refused as refused:
        print(f"turnkeep chaos: {refused}", file=sys.stderr)
        return refused.code
    sets = [*args.set, *(cluster.settings() if cluster is not None else [])]
    command = [sys.executable, "-m", "turnkeep", "run", "--config", str(plan.config), "--run-dir", str(run_dir),
               "--steps", str(args.steps), *[arg for pair in sets for arg in ("--set", pair)]]
    _announce(args, plan, seed, schedule, cluster)
    kills = _KillRounds(command, run_dir, cluster)
    try:
        final = kills.run(schedule, args, rng, plan.max_delay_s)
    finally:
        kills.close()
    return _report(args, plan, seed, kills, final)


def _checked_plan(args, run_dir: Path) -> _Plan:
    """The run's plan, or _Refused (exit 2) with nothing touched: a used run directory, unknown points or targets,
    a missing or bad config, or a model that cannot be made."""
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise _Refused(f"{run_dir} exists and is not empty; nothing in it was touched")
    try:
        points = parse_points(args.points or args.at)
        targets = parse_targets(args.target)
    except ValueError as err:
        raise _Refused(str(err)) from None
    config = Path(args.config).resolve()
    if not config.is_file():
        raise _Refused(f"no config file at {config}")
    try:
        max_delay_s = _max_delay_s(args, config)
    except ConfigError as err:
        raise _Refused(str(err)) from None
    if (failed := _model_made(config, args.set)) is not None:
        raise _Refused(failed)
    return _Plan(run_dir=run_dir, config=config, points=points, targets=targets, max_delay_s=max_delay_s)


def _started_cluster(targets: list[str]) -> LocalCluster | None:
    try:
        return _cluster_for(targets)
    except ClusterError as err:
        raise _Refused(f"the two-node cluster for the node target did not start: {err}", code=1) from None


def _announce(args, plan: _Plan, seed: int, schedule: list[tuple[str, str]], cluster: LocalCluster | None) -> None:
    if cluster is not None:
        print(f"turnkeep chaos: the run is on a two-node Ray cluster (head {HEAD_IP}, node {WORKER_IP}; logs in "
              f"{cluster.root}); a node kill takes the second node, which then joins again", flush=True)
    print(f"turnkeep chaos: {args.kills} kills of {plan.run_dir} (seed {seed}): "
          f"{', '.join(f'{target}@{point}' for target, point in schedule)}; random moments {RANDOM_MIN_DELAY_S}-"
          f"{plan.max_delay_s:.0f}s after a train step", flush=True)


class _KillRounds:
    """The incarnations of one chaos run: one kill a round, then the undisturbed last round; what each round found."""

    def __init__(self, command: list[str], run_dir: Path, cluster: LocalCluster | None) -> None:
        self._command = command
        self._run_dir = run_dir
        self._cluster = cluster
        self._sessions: list[int] = []
        self._current: Incarnation | None = None
        self.rounds: list[Round] = []
        self.problems: list[str] = []
        """What was wrong with the newest snapshot after a kill, one line a kill."""
        self.checks = 0
        """How many times the newest snapshot was checked."""

    def run(self, schedule: list[tuple[str, str]], args, rng: random.Random, max_delay_s: float) -> Round:
        """Every kill of the schedule (until the run finishes), then the last round; the last round's record."""
        for target, point in schedule:
            record = self._kill_round(target, point, args.phase_timeout_s, rng, max_delay_s)
            if record.outcome == "finished":
                break  # nothing left to kill: the run reached its last step
            if record.outcome in ("killed", "timeout", "stopped"):
                self._check_newest_snapshot(record)
        return final_round(self._incarnation(None), args.final_timeout_s)

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
        sessions_cleanup(self._sessions)
        kill_everything(self._run_dir, None)
        if self._cluster is not None:
            self._cluster.close()

    def _incarnation(self, point: str | None) -> Incarnation:
        """The running incarnation, or a new one started (armed at `point`) when the last one ended."""
        if self._current is None:
            self._current = Incarnation(self._command, self._run_dir, len(self._sessions) + 1, point)
            self._sessions.append(self._current.proc.pid)
        return self._current

    def _kill_round(self, target: str, point: str, phase_timeout_s: float, rng: random.Random,
                    max_delay_s: float) -> Round:
        if self._current is not None and point in POINTS:
            point = RANDOM  # a running incarnation's hooks are armed only at its start
        current = self._incarnation(point)
        record = one_round(current, self._run_dir, target, point, phase_timeout_s, rng, max_delay_s, self._cluster)
        self.rounds.append(record)
        node_lost = target == NODE and record.processes_killed > 0
        gone = [f"{role} at {record.lost_urls[role]}" if role in record.lost_urls else role for role in record.lost]
        lost = f" (lost with it: {', '.join(gone) or 'none of the run'})" if node_lost else ""
        print(f"turnkeep chaos: incarnation {record.incarnation}: {record.target} {record.outcome} at "
              f"{record.label} after {record.seconds:.0f}s{f' ({record.reason})' if record.reason else ''}{lost}",
              flush=True)
        if node_lost and self._cluster is not None:
            _node_back(self._cluster)
        if current.proc.poll() is not None:
            current.close()
            self._current = None
        return record

    def _check_newest_snapshot(self, record: Round) -> None:
        self.checks += 1
        problem = newest_snapshot_problem(self._run_dir)
        if problem is not None:
            self.problems.append(f"after the kill of incarnation {record.incarnation} at {record.label}: {problem}")
            print(f"turnkeep chaos: NEWEST SNAPSHOT BROKEN: {self.problems[-1]}", flush=True)


def _report(args, plan: _Plan, seed: int, kills: _KillRounds, final: Round) -> int:
    """Check the run's audit log, write and print the report; the exit code (0: every invariant held)."""
    run_dir = plan.run_dir
    verdict = check_run_dir(run_dir, newest_snapshot_problems=kills.problems, snapshot_checks=kills.checks)
    meta = {"run_dir": str(run_dir), "config": str(plan.config), "steps": args.steps, "seed": seed,
            "kills_requested": args.kills, "max_delay_s": plan.max_delay_s, "points": plan.points,
            "targets": plan.targets, "sets": list(args.set)}
    report = build_report(meta=meta, rounds=kills.rounds, final=final, verdict=verdict,
                          snapshot_problems=kills.problems, snapshot_checks=kills.checks)
    atomic_write_json(run_dir / "chaos" / "report.json", report)
    print(format_report(report, verdict))
    print(f"report: {run_dir / 'chaos' / 'report.json'}")
    return 0 if report["ok"] else 1


def _node_back(cluster: LocalCluster) -> None:
    try:
        cluster.restart_worker_node()
    except ClusterError as err:  # later node kills find no node ("missing"), which the report shows
        print(f"turnkeep chaos: warning: the second node did not join again: {err}", flush=True)


def _cluster_for(targets: list[str]) -> LocalCluster | None:
    """A node can only be lost from a cluster of two: a chaos run with the node target brings its own, in a short
    folder of the machine's temporary directory (Ray's socket paths have a length limit)."""
    if NODE not in targets:
        return None
    return LocalCluster(Path(tempfile.mkdtemp(prefix="tk-nodes-")))


def newest_snapshot_problem(run_dir: Path) -> str | None:
    """What is wrong with the newest published snapshot, in words (None: intact or none yet)."""
    from turnkeep.controller.fingerprint import config_fingerprint
    from turnkeep.controller.restore.restore_source import newest_published_problem
    from turnkeep.schemas.config import TurnkeepConfig

    run_json, config_json = run_dir / "run.json", run_dir / "config.json"
    if not (run_json.exists() and config_json.exists()):
        return None  # killed before the run claimed its directory: nothing was published
    run_id = orjson.loads(run_json.read_bytes())["run_id"]
    fingerprint = config_fingerprint(TurnkeepConfig.model_validate_json(config_json.read_bytes()))
    problem = newest_published_problem(run_dir, run_id, fingerprint)
    return None if problem is None else f"{problem.path}: {problem.problem} ({problem.detail})"


def _model_made(config: Path, sets: list[str]) -> str | None:
    """Make (or find cached) the tiny model the config asks for before the first incarnation, untimed: a first start
    that makes it (minutes for a bigger tiny model on 2 cores) would outlast --phase-timeout-s, be killed, and start
    making it again in every incarnation. None, or the line saying why it could not."""
    command = [sys.executable, "-m", "turnkeep", "make-model", "--config", str(config),
               *[arg for pair in sets for arg in ("--set", pair)]]
    print(f"turnkeep chaos: the model first, not timed: turnkeep {' '.join(command[3:])}", flush=True)
    made = subprocess.run(command, capture_output=True, text=True)
    if made.returncode != 0:
        last = (made.stderr.strip().splitlines() or ["no output"])[-1]
        return (f"the model could not be made (`turnkeep make-model` exit {made.returncode}: {last}); nothing was "
                "started")
    return None


def _max_delay_s(args, config: Path) -> float:
    if args.max_delay_s is not None:
        if args.max_delay_s <= RANDOM_MIN_DELAY_S:
            raise ConfigError(f"--max-delay-s {args.max_delay_s}: must be more than {RANDOM_MIN_DELAY_S} s")
        return args.max_delay_s
    return random_max_delay_s(load_config(config, parse_overrides(args.set)))


