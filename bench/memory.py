"""Memory: the peak RSS of each process of the overhead runs, by role."""

from __future__ import annotations

import argparse
from pathlib import Path

from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import metric_lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dirs", type=Path, nargs="*", help="finished runs (default: <out>/overhead/off and on)")


def run(args: argparse.Namespace) -> BenchResult:
    run_dirs = args.run_dirs or [args.out / "overhead" / "off", args.out / "overhead" / "on"]
    peaks = {}
    for run_dir in run_dirs:
        lines = metric_lines(run_dir, "memory")
        if not lines:
            raise SystemExit(f"{run_dir} has no memory line; it was made by an older turnkeep or did not finish")
        peaks[run_dir.name] = lines[-1]["peak_rss_mib_by_role"]
    roles = sorted({role for by_role in peaks.values() for role in by_role}, key=lambda r: -max(
        by_role.get(r, 0) for by_role in peaks.values()))
    rows = [[role, *(round(peaks[name].get(role, 0)) for name in peaks)] for role in roles]
    rows.append(["sum of peaks", *(round(sum(by_role.values())) for by_role in peaks.values())])
    table = markdown_table(["process (peak RSS MiB)", *peaks], rows)
    notes = ["Sampled with psutil after every train step. RSS counts pages shared between processes (vLLM's "
             "engine and its worker, torch libraries) in each of them, so the sum overstates the machine's use."]
    return BenchResult("memory", table, {"peak_rss_mib_by_role": peaks}, notes)
