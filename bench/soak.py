"""Soak: a run of the tiny model taking snapshot attempts back to back until `--attempts` have
ended, sampled every few seconds from outside: file descriptors, threads and RSS of each
process, against the attempts so far. The slopes (per 1,000 attempts, fitted over the second
half, after warm-up) should be flat; the Temporal histories should not grow (the run workflow
continues as new; each attempt's history stays the same length); and no gate holder may be
left when the run stops (SIGTERM: its final snapshot, then a clean exit)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import metric_lines
from turnkeep.bench.soak_samples import ROLES, sample_processes, slope_per_1000

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
SAMPLE_EVERY_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attempts", type=int, default=1000, help="snapshot attempts to run through (default 1000)")
    parser.add_argument("--interval-s", type=float, default=0.5, help="snapshot.attempt_interval_s (default 0.5)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--timeout-s", type=float, default=7200.0,
                        help="stop the run after this long and report the attempts so far (default 7200)")


def run(args: argparse.Namespace) -> BenchResult:
    run_dir = args.out / "soak" / "run"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise SystemExit(f"{run_dir} is not empty; the soak starts a new run (pick another --out)")
    log = args.out / "soak" / "run.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "turnkeep", "run", "--config", str(args.config), "--run-dir", str(run_dir),
               "--steps", "1000000"]
    for setting in [*args.set, "temporal.port=0", "temporal.ui_port=0",
                    f"snapshot.attempt_interval_s={args.interval_s}"]:
        command += ["--set", setting]
    samples = []
    started = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            while (attempts := _attempts(run_dir)) < args.attempts:
                if proc.poll() is not None:
                    raise SystemExit(f"the run exited {proc.returncode} after {attempts} attempts; see {log}")
                if time.monotonic() - started > args.timeout_s:
                    print(f"bench soak: {attempts} attempts after {args.timeout_s:.0f} s; stopping there and "
                          "reporting what was measured", flush=True)
                    break
                samples.append({"t": round(time.monotonic() - started, 1), "attempts": attempts,
                                "processes": sample_processes(run_dir)})
                time.sleep(SAMPLE_EVERY_S)
            histories = _history_lengths(run_dir)
            proc.send_signal(signal.SIGTERM)  # a preemption: final snapshot, then exit 0
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return _result(run_dir, samples, histories, code, time.monotonic() - started)


def _attempts(run_dir: Path) -> int:
    try:
        return len(metric_lines(run_dir, "snapshot"))
    except (OSError, ValueError):
        return 0


def _history_lengths(run_dir: Path) -> dict:
    """Events in the first and the last ten attempts' histories, and in the run workflow's current run."""
    from turnkeep.bench.soak_history import history_lengths

    return history_lengths(run_dir)


def _result(run_dir: Path, samples: list[dict], histories: dict, exit_code: int, wall_s: float) -> BenchResult:
    warm = samples[len(samples) // 2:]
    rows, slopes = [], {}
    for role in ROLES:
        points = [(s["attempts"], s["processes"][role]) for s in warm if role in s["processes"]]
        if len(points) < 2:
            continue
        xs = [float(a) for a, _ in points]
        first, last = points[0][1], points[-1][1]
        slopes[role] = {key: round(slope_per_1000(xs, [p[key] for _, p in points]), 2)
                        for key in ("fds", "threads", "rss_mib")}
        rows.append([role, f"{first['fds']:.0f} -> {last['fds']:.0f}", slopes[role]["fds"],
                     f"{first['threads']:.0f} -> {last['threads']:.0f}", slopes[role]["threads"],
                     f"{first['rss_mib']:.0f} -> {last['rss_mib']:.0f}", slopes[role]["rss_mib"]])
    table = markdown_table(["process", "fds (warm start -> end)", "fds / 1000 attempts", "threads",
                            "threads / 1000", "RSS MiB", "RSS MiB / 1000"], rows)
    attempts = metric_lines(run_dir, "snapshot")
    ended = [line for line in map(orjson.loads, (run_dir / "audit.jsonl").read_bytes().splitlines()[-50:])
             if line.get("event") == "run_ended"]
    left = {key: ended[-1][key] for key in ("admission_holders", "deadline_holders", "trainer_holders")} \
        if ended else None
    outcomes: dict[str, int] = {}
    for line in attempts:
        outcomes[line["outcome"]] = outcomes.get(line["outcome"], 0) + 1
    data = {"attempts": len(attempts), "attempts_by_outcome": outcomes, "exit_code": exit_code,
            "wall_s": round(wall_s, 1), "slopes_per_1000_attempts": slopes, "histories": histories,
            "holders_left_at_the_end": left, "samples": samples}
    notes = [f"{len(attempts)} attempts ({outcomes}) in {wall_s / 60:.1f} min; the run exited {exit_code} after "
             f"SIGTERM; slopes fitted over the second half of {len(samples)} samples.",
             f"Temporal histories: {histories}.",
             f"Holders left when the run stopped: {left}."]
    return BenchResult("soak", table, data, notes)
