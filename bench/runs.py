"""Run `turnkeep run` as its own process tree for a benchmark and read back what it wrote."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson


def run_turnkeep(run_dir: Path, config: Path, steps: int, settings: list[str], log: Path) -> float:
    """Train `steps` steps in a new `run_dir`; returns wall seconds; raises with the log's tail on failure."""
    if run_dir.exists() and any(run_dir.iterdir()):
        raise SystemExit(f"{run_dir} is not empty; benchmarks start new runs (pick another --out)")
    command = [sys.executable, "-m", "turnkeep", "run", "--config", str(config), "--run-dir", str(run_dir),
               "--steps", str(steps)]
    for setting in settings:
        command += ["--set", setting]
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "ab") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"turnkeep run for {run_dir} exited {code}; the end of {log}:\n{tail}")
    return time.monotonic() - started


def turnkeep_output(command: list[str], log: Path) -> str:
    """One `turnkeep` command to its end; its output (kept in `log`); its failure ends the benchmark with the tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "turnkeep", *command], capture_output=True, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"turnkeep {command[0]} exited {done.returncode}; the end of {log}:\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def run_id_of(run_dir: Path) -> str:
    """The run id a finished `turnkeep run` wrote; a directory without one ends the benchmark in one line."""
    path = run_dir / "run.json"
    if not path.is_file():
        raise SystemExit(f"turnkeep bench: {run_dir} is not a run directory (no run.json); pass the --run-dir of a "
                         "`turnkeep run`")
    return orjson.loads(path.read_bytes())["run_id"]


def metric_lines(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [row for row in map(orjson.loads, path.read_bytes().splitlines()) if row.get("kind") == kind]


def throughput(run_dir: Path) -> dict:
    """Rollout tokens/s and train steps/min over the training loop (from the first step on)."""
    steps = metric_lines(run_dir, "train_step")
    if len(steps) < 3:
        raise SystemExit(f"{run_dir} has {len(steps)} train steps; a benchmark needs more (raise --steps)")
    span = steps[-1]["wall_s"] - steps[0]["wall_s"]
    tokens = sum(s["rollout_tokens_per_s"] * (s["wall_s"] - p["wall_s"]) for p, s in zip(steps, steps[1:]))
    return {
        "steps": len(steps), "loop_s": round(span, 1),
        "rollout_tokens_per_s": round(tokens / span, 1),
        "train_steps_per_min": round((len(steps) - 1) / span * 60, 2),
        "reward_first10": round(statistics.fmean(s["reward_mean"] for s in steps[:10]), 3),
        "reward_last10": round(statistics.fmean(s["reward_mean"] for s in steps[-10:]), 3),
        "peak_rss_tree_mib": max(s["rss_tree_mib"] for s in steps),
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
