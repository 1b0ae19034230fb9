"""`turnkeep bench restart`: a whole-tree kill at a pinned moment, then the same command, split into its phases.

One run of the config trains until `--after` steps past a published snapshot, then every process of it is
SIGKILLed (as a lost machine loses them) and the same `turnkeep run` starts again; `--restarts` times, each kill
`train.save_period` steps after the one before, so every restart restores a snapshot and trains the same number of
undone steps again. Each restart is split at the moments its controller marks (`startup` in metrics.jsonl: Ray,
Temporal, the trainer, the engines, the environment server, the recovery) and at its first train step and first
generated turn (audit.jsonl), in seconds from the command. The CPU seconds each kind of process spent until that
first turn say what the 2 cores were busy with: the start is CPU-bound there, so they are what there is to take.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.restart_phases import PHASES, cpu_by_role, phases_of
from turnkeep.chaos.targets import kill_everything
from turnkeep.config.loader import load_config
from turnkeep.primitives.atomic_files import read_jsonl

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
FIRST_TURN_LIMIT_S = 300.0
"""A restart that has not generated a turn by then stops the benchmark with its log's tail."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--restarts", type=int, default=3, help="kills and restarts to time (default 3)")
    parser.add_argument("--after", type=int, default=4,
                        help="train steps past the newest snapshot at each kill: the steps a restart trains again "
                             "(default 4)")


def run(args: argparse.Namespace) -> BenchResult:
    base = (args.out / "restart").resolve()
    run_dir = base / "run"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise SystemExit(f"{run_dir} is not empty; benchmarks start new runs (pick another --out)")
    cfg = load_config(args.config, dict(s.split("=", 1) for s in args.set))
    period = cfg.train.save_period
    if not 0 < args.after < period:
        raise SystemExit(f"--after {args.after}: it must be between 1 and train.save_period - 1 ({period - 1}), so "
                         "that the kill falls after a snapshot and before the next one")
    command = [sys.executable, "-m", "turnkeep", "run", "--config", str(args.config.resolve()), "--run-dir",
               str(run_dir), "--steps", str(period * (args.restarts + 2))]
    for setting in args.set:
        command += ["--set", setting]
    restarts = []
    process = _start(command, base / "incarnation-1.log")
    try:
        for n in range(1, args.restarts + 1):
            _until_trained(run_dir, period * n, period * n + args.after, process)
            kill_everything(run_dir, process.pid)
            process.wait()
            began = time.time()
            process = _start(command, base / f"incarnation-{n + 1}.log")
            restarts.append(_timed_restart(run_dir, n + 1, began, process))
    finally:
        kill_everything(run_dir, process.pid)
        process.wait()
    return _result(args, cfg.train.save_period, restarts)


def _start(command: list[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _until_trained(run_dir: Path, snapshot_step: int, kill_step: int, process: subprocess.Popen) -> None:
    """Until the snapshot of `snapshot_step` is published and step `kill_step` is trained."""
    deadline = time.monotonic() + FIRST_TURN_LIMIT_S + 30 * kill_step
    while True:
        events = _audit(run_dir)
        published = any(e["event"] == "snapshot_published" and e.get("step") == snapshot_step for e in events)
        if published and any(e["event"] == "step_trained" and e.get("step", 0) >= kill_step for e in events):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the run did not publish the snapshot of step {snapshot_step} and train step "
                             f"{kill_step} (exit {process.poll()}); see {run_dir.parent}/incarnation-*.log")
        time.sleep(0.05)


def _timed_restart(run_dir: Path, incarnation: int, began: float, process: subprocess.Popen) -> dict:
    deadline = time.monotonic() + FIRST_TURN_LIMIT_S
    while True:
        events = [e for e in _audit(run_dir) if e.get("inc") == incarnation]
        kinds = {e["event"] for e in events}
        if {"turn_committed", "step_trained"} <= kinds:
            break
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"restart {incarnation - 1} generated no turn within {FIRST_TURN_LIMIT_S:.0f} s "
                             f"(exit {process.poll()}); see {run_dir.parent}/incarnation-{incarnation}.log")
        time.sleep(0.05)
    cpu = cpu_by_role(_processes_since(began))
    startup = [m for m in _metrics(run_dir) if m.get("kind") == "startup" and m.get("incarnation") == incarnation]
    restored = next((e for e in events if e["event"] == "restored"), {})
    undone = (restored.get("kept_after_cut") or {}).get("undone_steps") or []
    return {"incarnation": incarnation, "phases": phases_of(began, startup[-1] if startup else None, events),
            "cpu_s": cpu, "undone_steps": len(undone), "source": restored.get("source")}


def _processes_since(began: float) -> list[tuple[str, float]]:
    """(command line, CPU seconds) of every process started since `began`: the restart's, as nothing else of the
    benchmark starts processes meanwhile."""
    found = []
    for process in psutil.process_iter(["cmdline", "create_time", "cpu_times"]):
        info = process.info
        if info["create_time"] is None or info["create_time"] < began - 1 or info["cpu_times"] is None:
            continue
        found.append((" ".join(info["cmdline"] or []), info["cpu_times"].user + info["cpu_times"].system))
    return found


def _audit(run_dir: Path) -> list[dict]:
    return _jsonl(run_dir / "audit.jsonl")


def _metrics(run_dir: Path) -> list[dict]:
    return _jsonl(run_dir / "metrics.jsonl")


def _jsonl(path: Path) -> list[dict]:
    """The file's lines so far (the line being appended is skipped); none while the run has not written it."""
    try:
        return list(read_jsonl(path))
    except FileNotFoundError:
        return []


def _seconds(value: float) -> str:
    """One decimal; the process start, read to the kernel's 10 ms tick, can fall a few ms before the command's clock,
    and "-0.0" would read as a fault."""
    return f"{round(value, 1) + 0.0:.1f}"


def _result(args: argparse.Namespace, save_period: int, restarts: list[dict]) -> BenchResult:
    rows = []
    for phase, about in PHASES.items():
        values = [r["phases"][phase] for r in restarts if r["phases"].get(phase) is not None]
        if values:
            spread = f"{_seconds(min(values))}-{_seconds(max(values))}"
            rows.append([about, _seconds(statistics.median(values)), spread])
    table = markdown_table(["seconds from the command", "median", "range"], rows)
    roles = sorted({role for r in restarts for role in r["cpu_s"]}, key=lambda role: -statistics.median(
        r["cpu_s"].get(role, 0.0) for r in restarts))
    table += "\n\n" + markdown_table(
        ["CPU s until the first turn (median)", *roles, "all"],
        [["", *(f"{statistics.median(r['cpu_s'].get(role, 0.0) for r in restarts):.1f}" for role in roles),
          f"{statistics.median(sum(r['cpu_s'].values()) for r in restarts):.1f}"]])
    first_turn = statistics.median(r["phases"]["first_turn"] for r in restarts)
    notes = [
        f"{len(restarts)} restarts of {args.config.name}, each killed {args.after} train steps after a published "
        f"snapshot (`train.save_period` = {save_period}), so each restores it and trains {args.after} undone steps "
        f"again before generation resumes (the staleness bound holds it meanwhile). Median command -> first "
        f"generated turn: {first_turn:.1f} s.",
        "Phases are the controller's own marks (`startup` in metrics.jsonl), the restore (`restored`) and the first "
        "train step and turn of the new incarnation (audit.jsonl), from the moment the benchmark ran the command. "
        "Ray and Temporal start side by side; Temporal counts as up when the controller, done with Ray, sees it.",
        "CPU seconds are every process the restart started, summed by kind, sampled at the first turn; on 2 cores "
        "twice the wall time is all there is.",
    ]
    return BenchResult("restart", table, {"restarts": restarts, "after": args.after, "save_period": save_period},
                       notes)
