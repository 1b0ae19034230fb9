"""Overhead: the default task with snapshots off, then on (every 20 s), same seed and
length, back to back: rollout tokens/s, train steps/min and their ratio."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.report import BenchResult, markdown_table
from bench.runs import metric_lines, percentile, run_turnkeep, throughput

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=200, help="train steps of each run (default 200)")
    parser.add_argument("--interval-s", type=float, default=20.0, help="snapshot interval of the 'on' run")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)


def run_dirs(out: Path) -> tuple[Path, Path]:
    return out / "overhead" / "off", out / "overhead" / "on"


def run(args: argparse.Namespace) -> BenchResult:
    off_dir, on_dir = run_dirs(args.out)
    common = [*args.set, "temporal.port=0", "temporal.ui_port=0"]
    runs = {}
    for label, run_dir, extra in (
        ("off", off_dir, ["snapshot.enabled=false"]),
        ("on", on_dir, ["snapshot.enabled=true", f"snapshot.attempt_interval_s={args.interval_s}"]),
    ):
        print(f"bench overhead: snapshots {label}: {args.steps} steps in {run_dir}", flush=True)
        began = time.time()
        wall = run_turnkeep(run_dir, args.config, args.steps, [*common, *extra], args.out / "overhead" / f"{label}.log")
        runs[label] = {**throughput(run_dir), "wall_s": round(wall, 1), "started_unix_s": began,
                       "run_dir": str(run_dir)}
    attempts = metric_lines(on_dir, "snapshot")
    closed = [a["admission_closed_s"] for a in attempts]
    on, off = runs["on"], runs["off"]
    data = {
        "runs": runs,
        "ratio_rollout_tokens_per_s": round(on["rollout_tokens_per_s"] / off["rollout_tokens_per_s"], 3),
        "ratio_train_steps_per_min": round(on["train_steps_per_min"] / off["train_steps_per_min"], 3),
        "attempts": len(attempts),
        "attempts_by_outcome": _count(a["outcome"] for a in attempts),
        "admission_closed_s": {"median": statistics.median(closed) if closed else 0.0,
                               "p90": percentile(closed, 0.9), "max": max(closed, default=0.0)},
        "trainer_wait_s_total": round(sum(a["trainer_wait_s"] for a in attempts), 3),
    }
    rows = [
        [label, r["rollout_tokens_per_s"], r["train_steps_per_min"], r["wall_s"], r["reward_last10"]]
        for label, r in runs.items()
    ]
    rows.append(["on / off", data["ratio_rollout_tokens_per_s"], data["ratio_train_steps_per_min"], "", ""])
    table = markdown_table(["snapshots", "rollout tok/s", "train steps/min", "wall s", "reward last 10"], rows)
    notes = [
        f"{len(attempts)} attempts in the 'on' run ({data['attempts_by_outcome']}); admission closed median "
        f"{data['admission_closed_s']['median']:.3f}s, max {data['admission_closed_s']['max']:.3f}s; the trainer "
        f"waited {data['trainer_wait_s_total']:.2f}s in all.",
        "What the 'on' run pays: rollouts stop while admission is closed, and the Temporal dev server "
        "shares the two cores with vLLM and the trainer.",
    ]
    return BenchResult("overhead", table, data, notes)


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts
