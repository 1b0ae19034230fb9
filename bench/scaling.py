"""`turnkeep bench scaling`: how one snapshot attempt's cost grows with the parked agents (A)
and the rows waiting in the data plane (R), with synthetic agents and rows.

No model, Ray, vLLM or Temporal: each cell of the A x R grid builds the state once (the
agents parked through the real environment-server classes, the data plane and ledgers
filled through their own calls), then times the attempt's phases through the project's
real code (`bench.timed_attempt`). What matters for a live run is the barrier: while
the cut holds it, no finished rollout is stored and no receipt is ACKed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from turnkeep.bench.filled_controller import STEP, FilledController
from turnkeep.bench.parked_gym import ParkedGym
from turnkeep.bench.peak_rss import give_memory_back, peak_rss_bytes, reset_peak, rss_bytes
from turnkeep.bench.phase_growth import EXPECTED_GROWTH, phase_growth
from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.timed_attempt import AttemptTimes, timed_attempt
from turnkeep.controller.stores import snapshot_store
from turnkeep.primitives import snapshot_paths

log = logging.getLogger("turnkeep.bench")

DEFAULT_AGENTS = "10,100,1000,10000"
DEFAULT_ROWS = "1000,10000,100000,1000000"
MB = 1e6


@dataclass(frozen=True)
class Cell:
    agents: int
    rows: int
    prepare_s: float
    commit_s: float
    cut_s: float
    barrier_s: float
    publish_s: float
    """Medians over the repeats."""
    gc_s: dict[str, float]
    """Median seconds of the cyclic garbage collector within each phase and the barrier."""
    bytes_written: int
    build_s: float
    """Building the synthetic state (not part of any phase)."""
    rss_start_mb: float
    peak_rss_mb: float
    peak_rss_scope: str
    """`cell` when the peak was reset at the cell's start, else `process` (the whole run's peak)."""
    snapshot_dir: str
    samples: list[dict]

    @property
    def publish_mb_s(self) -> float:
        return self.bytes_written / MB / self.publish_s if self.publish_s > 0 else float("inf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agents", type=_sizes, default=_sizes(DEFAULT_AGENTS),
                        help=f"parked agents per cell, comma-separated (default {DEFAULT_AGENTS}; 10k = 10000)")
    parser.add_argument("--rows", type=_sizes, default=_sizes(DEFAULT_ROWS),
                        help=f"data-plane rows per cell, comma-separated (default {DEFAULT_ROWS}; 1m = 1000000)")
    parser.add_argument("--turns", type=int, default=3, help="tool turns per parked agent and per row (default 3)")
    parser.add_argument("--repeats", type=int, default=1, help="attempts per cell; the table shows medians (default 1)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where snapshots are written and kept (default: a temporary directory, removed after)")


def run(args: argparse.Namespace) -> BenchResult:
    agents, rows = sorted(set(args.agents)), sorted(set(args.rows))
    if args.turns < 1 or args.repeats < 1:
        raise ValueError(f"--turns and --repeats must be at least 1, got {args.turns} and {args.repeats}")
    temporary = args.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="turnkeep-bench-scaling-")) if temporary else args.work_dir.absolute()
    try:
        (work / "checkpoints" / f"step_{STEP}").mkdir(parents=True, exist_ok=True)
        # A reused work dir keeps its newest snapshots; numbering goes on after them.
        already = snapshot_store.published(snapshot_paths.snapshots_root(work, STEP))
        numbers = itertools.count((already[-1] + 1) if already else 1)
        cells = [_measure_cell(a, r, args.turns, args.repeats, work, numbers) for a in agents for r in rows]
    finally:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
    growth = {
        phase: phase_growth(phase, {(c.agents, c.rows): getattr(c, f"{phase}_s") for c in cells}, agents, rows)
        for phase in EXPECTED_GROWTH
    }
    return BenchResult(
        name="scaling",
        table=_table(cells),
        data={
            "grid": {"agents": agents, "rows": rows, "turns": args.turns, "repeats": args.repeats},
            "work_dir": None if temporary else str(work),
            "cells": [{**asdict(c), "publish_mb_s": c.publish_mb_s} for c in cells],
            "growth": {phase: fit for phase, (_, fit) in growth.items()},
        },
        notes=[sentence for sentence, _ in growth.values()] + _other_notes(cells),
    )


def _measure_cell(agents: int, rows: int, turns: int, repeats: int, work: Path, numbers: Iterator[int]) -> Cell:
    give_memory_back()  # the previous cell's state is garbage now; start this one's peak low
    scope = "cell" if reset_peak() else "process"
    rss_start = rss_bytes()
    samples, build_s = asyncio.run(_attempts(agents, rows, turns, repeats, work, numbers))
    peak = peak_rss_bytes()
    give_memory_back()

    def median(field: str) -> float:
        return statistics.median(getattr(s, field) for s in samples)

    cell = Cell(
        agents=agents, rows=rows, prepare_s=median("prepare_s"), commit_s=median("commit_s"), cut_s=median("cut_s"),
        barrier_s=median("barrier_s"), publish_s=median("publish_s"),
        gc_s={phase: statistics.median(s.gc_s[phase] for s in samples) for phase in samples[0].gc_s},
        bytes_written=samples[-1].bytes_written,
        build_s=build_s, rss_start_mb=rss_start / MB, peak_rss_mb=peak / MB, peak_rss_scope=scope,
        snapshot_dir=samples[-1].snapshot_dir, samples=[asdict(s) for s in samples],
    )
    log.info("scaling: A=%d R=%d cut %.3fs (barrier %.3fs), publish %.3fs, %d bytes, peak RSS %.0f MB",
             agents, rows, cell.cut_s, cell.barrier_s, cell.publish_s, cell.bytes_written, cell.peak_rss_mb)
    return cell


async def _attempts(
    agents: int, rows: int, turns: int, repeats: int, work: Path, numbers: Iterator[int]
) -> tuple[list[AttemptTimes], float]:
    started = time.perf_counter()
    rng = random.Random(f"scaling:{agents}:{rows}")
    gym = ParkedGym()
    await gym.park(agents, turns, rng)
    controller = FilledController()
    journal = controller.start_journal(work)
    controller.fill(rows, turns, gym.requests, rng)
    await journal.sync()  # in a live run each row's record is on disk before its ACK, long before a cut
    build_s = time.perf_counter() - started
    try:
        samples = [await timed_attempt(gym, controller, work, next(numbers)) for _ in range(repeats)]
    finally:
        await gym.release()
    return samples, build_s


def _table(cells: list[Cell]) -> str:
    headers = ["A", "R", "prepare s", "commit s", "cut s (barrier s)", "publish s", "bytes", "publish MB/s",
               "peak RSS MB"]
    rows = [
        [c.agents, c.rows, c.prepare_s, c.commit_s, f"{c.cut_s:.3g} ({c.barrier_s:.3g})", c.publish_s,
         c.bytes_written, c.publish_mb_s, c.peak_rss_mb]
        for c in sorted(cells, key=lambda c: (c.agents, c.rows))
    ]
    return markdown_table(headers, rows)


def _other_notes(cells: list[Cell]) -> list[str]:
    biggest = max(cells, key=lambda c: (c.agents * c.rows, c.rows))
    stalls = max(cells, key=lambda c: c.barrier_s)
    scope = "" if biggest.peak_rss_scope == "cell" else " (process-lifetime peak: this system cannot reset it per cell)"
    return [
        f"The longest barrier (A={stalls.agents}, R={stalls.rows}) held the data plane for {stalls.barrier_s:.2f}s, "
        f"{stalls.gc_s['barrier']:.2f}s of it in Python's cyclic garbage collector (the state capture runs with the "
        "collector paused, `primitives/gc_pause.py`; what is left is collected while reading the saved agents back). "
        f"Over the whole cut the collector took {stalls.gc_s['cut']:.2f}s of {stalls.cut_s:.2f}s. Under the barrier "
        "the cut reads counts and digests the data plane and the group ledger keep as they change, one journal "
        "position and the saved agents' continuations: it visits no row and no settled group.",
        f"Peak RSS of the largest cell (A={biggest.agents}, R={biggest.rows}): {biggest.peak_rss_mb:.0f} MB{scope}, "
        f"from {biggest.rss_start_mb:.0f} MB at its start; building its state took {biggest.build_s:.1f}s (untimed).",
        "Not in these figures: closing admission, the trainer hold, the policy participant, HTTP and Temporal "
        "round trips, and the cut's one call to the environment server; none of them grows with A or R.",
        "publish here digests every file with snapshot_store.artifact_for, which a real attempt does elsewhere "
        "(the participant's commit digests agents.jsonl, the cut activity digests state.json after the barrier): "
        "agents.jsonl is digested twice per attempt here, once in commit and once in publish.",
    ]


def _sizes(text: str) -> list[int]:
    """`10,100,1k,1m` -> [10, 100, 1000, 1000000]."""
    sizes = []
    for part in text.split(","):
        part = part.strip().lower()
        try:
            scale = {"k": 1000, "m": 1_000_000}.get(part[-1:], 0)
            size = int(float(part[:-1]) * scale) if scale else int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a size: {part!r} (use e.g. 10,100,1k,1m)") from None
        if size < 1:
            raise argparse.ArgumentTypeError(f"sizes must be at least 1, got {part!r}")
        sizes.append(size)
    return sizes
