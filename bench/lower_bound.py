"""The lower bound: per attempt, admission-closed seconds against the shortest possible,
the time the slowest in-flight turn still needed to reach its boundary plus the bytes
written at the disk's measured write speed.

The slowest turn is read from the audit log (`bench.turn_bound`: the controller's hold
event and the environment server's own turn commits), not from the product's timing of
its own parking, which is shown beside it."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import metric_lines, percentile
from turnkeep.bench.turn_bound import turn_bounds
from turnkeep.primitives.audit_log import read_audit

PROBE_BYTES = 64 * 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=Path, help="a finished run with snapshots (default: <out>/overhead/on)")


def disk_write_mib_s(directory: Path, repeats: int = 3) -> float:
    """Sequential write plus fsync, the way publish writes (best of `repeats`)."""
    block = os.urandom(4 * 2**20)
    best = 0.0
    for attempt in range(repeats):
        path = directory / f".disk-probe-{attempt}"
        began = time.monotonic()
        with open(path, "wb") as f:
            for _ in range(PROBE_BYTES // len(block)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        best = max(best, PROBE_BYTES / 2**20 / (time.monotonic() - began))
        path.unlink()
    return best


def run(args: argparse.Namespace) -> BenchResult:
    run_dir = args.run_dir or args.out / "overhead" / "on"
    attempts = [a for a in metric_lines(run_dir, "snapshot") if a["outcome"].startswith("published")]
    if not attempts:
        raise SystemExit(f"{run_dir} has no published snapshot; run `turnkeep bench overhead` first")
    speed = disk_write_mib_s(run_dir)
    bounds = turn_bounds(read_audit(run_dir))
    per_attempt = []
    for a in attempts:
        write_s = a["bytes_written"] / 2**20 / speed
        turn = bounds.get(a["checkpoint_id"])
        slowest = turn.slowest_turn_s if turn is not None else 0.0
        bound = slowest + write_s
        per_attempt.append({"checkpoint_id": a["checkpoint_id"], "admission_closed_s": a["admission_closed_s"],
                            "slowest_turn_s": slowest, "agents_in_flight": turn.agents if turn else 0,
                            "product_parked_s": a.get("agents_parked_s", 0.0), "write_s": round(write_s, 4),
                            "lower_bound_s": round(bound, 4),
                            "ratio": round(a["admission_closed_s"] / bound, 2) if bound > 0 else None})
    ratios = [p["ratio"] for p in per_attempt if p["ratio"] is not None]
    column = lambda key: [p[key] for p in per_attempt]  # noqa: E731 - a local shorthand
    rows = [[name, statistics.median(column(key)), percentile(column(key), 0.9), max(column(key))]
            for name, key in (("admission closed s", "admission_closed_s"),
                              ("slowest turn s (audit log)", "slowest_turn_s"),
                              ("agents parked s (the product's own timing)", "product_parked_s"),
                              ("write s", "write_s"), ("lower bound s", "lower_bound_s"))]
    if ratios:
        rows.append(["closed / lower bound", statistics.median(ratios), percentile(ratios, 0.9), max(ratios)])
    table = markdown_table(["per attempt", "median", "p90", "max"], rows)
    overhead = [p["admission_closed_s"] - p["lower_bound_s"] for p in per_attempt]
    notes = [
        f"{len(per_attempt)} published attempts of {run_dir}; disk write speed {speed:.0f} MiB/s (64 MiB, fsync).",
        f"Above the bound: median {statistics.median(overhead):.3f}s per attempt, spent in the calls between the "
        "controller and the participants (prepare, status polls every 50 ms, commit, cut, publish, resume) and in "
        "Temporal's dispatch of five activities while admission is closed.",
    ]
    return BenchResult("lower_bound", table, {"run_dir": str(run_dir), "disk_write_mib_s": round(speed, 1),
                                              "attempts": per_attempt}, notes)
