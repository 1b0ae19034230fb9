"""`turnkeep chaos`: kill a training run again and again at chosen moments, then check the invariants.

Each round starts `turnkeep run` on the same run directory (so every start after the
first is a restart that recovers), waits for a kill point, and SIGKILLs the whole
process tree the way a preempted machine would. After the last kill the run goes on
to the end undisturbed, and the audit log of all incarnations is checked against
DESIGN.md's invariants. Everything lands in `<run_dir>/chaos/` (logs, report.json).
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

from primitives.atomic_files import atomic_write_json
from primitives.chaos_points import ENV_POINT, ENV_WAIT, POINTS, marker_path
from primitives.process_tree import kill_tree
from workers.chaos_invariants import Verdict, check_run_dir

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
TRAINING = "training"
"""A random moment a few seconds after a train step (no hook in the code)."""
ALL_POINTS = (TRAINING, *POINTS)
FRESH_START_SKIPS = ("restore",)
"""Points a first start never reaches (it has nothing to restore), so round 1 avoids them."""
HOOK_WAIT_S = "120"
"""How long a hooked run sits at its point; far longer than the kill takes, so it never moves on."""
POLL_S = 0.1


@dataclass
class Round:
    incarnation: int
    point: str
    outcome: str
    """`killed`, `timeout` (the point never came; killed anyway), `finished` or `crashed` (exited on its own)."""
    exit_code: int | None
    seconds: float
    processes_killed: int = 0
    log: str = ""

    @property
    def label(self) -> str:
        return f"timeout:{self.point}" if self.outcome == "timeout" else self.point


# ---- the command line ----


def add_chaos_parser(subparsers) -> argparse.ArgumentParser:
    chaos = subparsers.add_parser("chaos", help="kill a run many times at chosen points, then check the invariants")
    chaos.add_argument("--run-dir", type=Path, required=True, help="a new (or empty) run directory")
    chaos.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="TOML config (default: configs/tiny.toml)")
    chaos.add_argument("--kills", type=int, default=20, help="how many times to kill the run (default 20)")
    chaos.add_argument("--points", default=",".join(ALL_POINTS),
                       help=f"comma list of kill points (default: all of {','.join(ALL_POINTS)})")
    chaos.add_argument("--steps", type=int, default=200, help="train steps of the whole run (default 200)")
    chaos.add_argument("--seed", type=int, help="seed of the kill schedule and timing (default: random, reported)")
    chaos.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="config override passed to every `turnkeep run`")
    chaos.add_argument("--phase-timeout-s", type=float, default=300.0,
                       help="give up waiting for a point after this long and kill anyway (default 300)")
    chaos.add_argument("--final-timeout-s", type=float, default=3600.0,
                       help="how long the last, undisturbed run may take to finish (default 3600)")
    return chaos


def parse_points(text: str) -> list[str]:
    points = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in points if p not in ALL_POINTS]
    if unknown or not points:
        raise ValueError(f"--points {text!r}: unknown {unknown}; choose from {', '.join(ALL_POINTS)}")
    return list(dict.fromkeys(points))


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
        "kills_by_point": dict(sorted(Counter(r.label for r in rounds if r.outcome in ("killed", "timeout")).items())),
        "restores_by_source": dict(sorted(counts.restores_by_source.items())),
        "snapshot_checks": snapshot_checks,
        "newest_snapshot_problems": list(snapshot_problems),
        "verdict": verdict.to_dict(),
        "median_restart_to_first_generation_s": counts.median_restart_to_first_generation_s,
        "tokens_regenerated": counts.tokens_regenerated,
        "tokens_generated": counts.tokens_generated,
        "tokens_regenerated_share": counts.tokens_regenerated_share,
        "warnings": run_warnings(rounds, meta.get("kills_requested", len(rounds))),
        "failures": failures,
        "ok": verdict.ok and not failures,
    }


def format_report(report: dict, verdict: Verdict) -> str:
    def listing(counts: dict) -> str:
        return ", ".join(f"{key} {n}" for key, n in counts.items()) or "none"

    final = report["final_run"]
    lines = [
        f"turnkeep chaos: {report.get('run_dir', '')} (seed {report.get('seed')})",
        f"kills by point: {listing(report['kills_by_point'])}",
    ]
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
        points = parse_points(args.points)
    except ValueError as err:
        print(f"turnkeep chaos: {err}", file=sys.stderr)
        return 2
    config = Path(args.config).resolve()
    if not config.is_file():
        print(f"turnkeep chaos: no config file at {config}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    schedule = point_schedule(points, args.kills, rng)
    command = [sys.executable, "-m", "workers.cli", "run", "--config", str(config), "--run-dir", str(run_dir),
               "--steps", str(args.steps), *[arg for pair in args.set for arg in ("--set", pair)]]
    print(f"turnkeep chaos: {args.kills} kills of {run_dir} (seed {seed}): {', '.join(schedule)}", flush=True)

    rounds: list[Round] = []
    problems: list[str] = []
    checks = 0
    for number, point in enumerate(schedule, start=1):
        record = _one_round(command, run_dir, number, point, args.phase_timeout_s, rng)
        rounds.append(record)
        print(f"turnkeep chaos: incarnation {number}: {record.outcome} at {record.label} after "
              f"{record.seconds:.0f}s", flush=True)
        if record.outcome == "finished":
            break  # nothing left to kill: the run reached its last step
        if record.outcome in ("killed", "timeout"):
            checks += 1
            problem = newest_snapshot_problem(run_dir)
            if problem is not None:
                problems.append(f"after the kill of incarnation {number} at {record.label}: {problem}")
                print(f"turnkeep chaos: NEWEST SNAPSHOT BROKEN: {problems[-1]}", flush=True)
    final = _final_round(command, run_dir, len(rounds) + 1, args.final_timeout_s)

    verdict = check_run_dir(run_dir, newest_snapshot_problems=problems, snapshot_checks=checks)
    meta = {"run_dir": str(run_dir), "config": str(config), "steps": args.steps, "seed": seed,
            "kills_requested": args.kills, "points": points, "sets": list(args.set)}
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


def _one_round(command: list[str], run_dir: Path, number: int, point: str, timeout_s: float,
               rng: random.Random) -> Round:
    marker_path(run_dir).unlink(missing_ok=True)
    log = _IncarnationLog(run_dir, number)
    started = time.monotonic()
    proc = _start(command, point, log)
    try:
        moment = _wait_for_kill_moment(proc, run_dir, point, timeout_s, rng, log)
        killed = kill_tree(proc.pid) if moment != "exited" else 0
        code = proc.wait()
    finally:
        _stop(proc)
        log.settle()
    outcome = {"reached": "killed", "timeout": "timeout"}.get(moment) or ("finished" if code == 0 else "crashed")
    return Round(number, point, outcome, code, round(time.monotonic() - started, 2), killed, str(log.path))


def _final_round(command: list[str], run_dir: Path, number: int, timeout_s: float) -> Round:
    log = _IncarnationLog(run_dir, number)
    started = time.monotonic()
    proc = _start(command, None, log)
    try:
        deadline = started + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            log.settle()
            time.sleep(1.0)
        timed_out = proc.poll() is None
        killed = kill_tree(proc.pid) if timed_out else 0
        code = proc.wait()
    finally:
        _stop(proc)
        log.settle()
    outcome = "timeout" if timed_out else ("finished" if code == 0 else "crashed")
    return Round(number, "none", outcome, code, round(time.monotonic() - started, 2), killed, str(log.path))


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


def _wait_for_kill_moment(proc: subprocess.Popen, run_dir: Path, point: str, timeout_s: float,
                          rng: random.Random, log: _IncarnationLog) -> str:
    """`reached`, `timeout` or `exited` (the run ended on its own first)."""
    deadline = time.monotonic() + timeout_s
    metrics = run_dir / "metrics.jsonl"
    steps_seen = count_train_steps(metrics)  # earlier incarnations' steps are not new
    marker = marker_path(run_dir)
    while time.monotonic() < deadline:
        log.settle()
        if proc.poll() is not None:
            return "exited"
        if point == TRAINING:
            steps_now = count_train_steps(metrics)
            steps_seen = min(steps_seen, steps_now)  # a restart may rewrite the file shorter
            if steps_now > steps_seen:
                # Somewhere between steps: mid-generation, mid-backward or mid-refit.
                pause_until = time.monotonic() + rng.uniform(1.0, 8.0)
                while time.monotonic() < pause_until:
                    if proc.poll() is not None:
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
