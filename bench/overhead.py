"""Overhead: the default task with snapshots off and on, same seed and length, in alternating pairs.

Each pair runs snapshots off and then each kind of snapshot (`snapshot.agents`: parked,
journal); the order flips every other pair, so a machine that warms up or slows down over
the benchmark does not favour one side. The ratio on/off is taken within each pair and
reported as the median with its spread (lowest and highest pair).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import metric_lines, percentile, run_turnkeep, throughput

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
AGENT_MODES = ("parked", "journal")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=200, help="train steps of each run (default 200)")
    parser.add_argument("--interval-s", type=float, default=None,
                        help="snapshot.attempt_interval_s of the 'on' runs (default: the config's; unset, journaled "
                             "agents snapshot at trainer checkpoints only and parked ones every 20 s)")
    parser.add_argument("--pairs", type=int, default=3, help="alternating off/on pairs (default 3)")
    parser.add_argument("--agents", default="parked", help="comma-separated snapshot.agents modes of the 'on' "
                                                          "runs, each in every pair (default parked)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)


def run_dirs(out: Path) -> tuple[Path, Path]:
    """The first pair's off run and its first 'on' run (what lower_bound, orchestration and memory read)."""
    return out / "overhead" / "off", out / "overhead" / "on"


def _label(mode: str | None, modes: list[str]) -> str:
    if mode is None:
        return "off"
    return "on" if mode == modes[0] else f"on-{mode}"


def _run_dir(out: Path, label: str, pair: int) -> Path:
    return out / "overhead" / (label if pair == 1 else f"{label}-{pair}")


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in AGENT_MODES]
    if not modes or unknown or len(set(modes)) != len(modes):
        raise SystemExit(f"bench overhead: --agents {text!r}: give distinct modes among {', '.join(AGENT_MODES)}")
    return modes


def run(args: argparse.Namespace) -> BenchResult:
    modes = _modes(args.agents)
    if args.pairs < 1:
        raise SystemExit(f"bench overhead: --pairs {args.pairs}: at least 1")
    common = [*args.set, "temporal.port=0", "temporal.ui_port=0"]
    runs: dict[str, dict] = {}
    for pair in range(1, args.pairs + 1):
        order: list[str | None] = [None, *modes]
        if pair % 2 == 0:
            order.reverse()
        for mode in order:
            label = _label(mode, modes)
            run_dir = _run_dir(args.out, label, pair)
            interval = [] if args.interval_s is None else [f"snapshot.attempt_interval_s={args.interval_s}"]
            extra = (["snapshot.enabled=false"] if mode is None else
                     ["snapshot.enabled=true", *interval, f"snapshot.agents={mode}"])
            print(f"bench overhead: pair {pair}, {label}: {args.steps} steps in {run_dir}", flush=True)
            began = time.time()
            log = run_dir.parent / f"{run_dir.name}.log"
            wall = run_turnkeep(run_dir, args.config, args.steps, [*common, *extra], log)
            runs[f"{label} #{pair}"] = {**throughput(run_dir), "wall_s": round(wall, 1), "started_unix_s": began,
                                        "run_dir": str(run_dir), "label": label, "pair": pair, "mode": mode}
    return _report(args, modes, runs)


def _cadence(args: argparse.Namespace) -> str:
    if args.interval_s is not None:
        return f"snapshots every {args.interval_s:g} s and at every trainer checkpoint"
    return "snapshot.attempt_interval_s as the config sets it (unset: journaled agents at trainer checkpoints only)"


def _report(args: argparse.Namespace, modes: list[str], runs: dict[str, dict]) -> BenchResult:
    data: dict = {"runs": runs, "pairs": args.pairs, "modes": {}}
    rows = [[name, r["rollout_tokens_per_s"], r["train_steps_per_min"], r["wall_s"], r["reward_last10"]]
            for name, r in runs.items()]
    notes = []
    for mode in modes:
        label = _label(mode, modes)
        ratios = {"rollout_tokens_per_s": [], "train_steps_per_min": []}
        attempts: list[dict] = []
        for pair in range(1, args.pairs + 1):
            off, on = runs[f"off #{pair}"], runs[f"{label} #{pair}"]
            for key in ratios:
                ratios[key].append(on[key] / off[key])
            attempts += metric_lines(Path(on["run_dir"]), "snapshot")
        closed = [a["admission_closed_s"] for a in attempts]
        summary = {key: _spread(values) for key, values in ratios.items()}
        summary.update({
            "attempts": len(attempts), "attempts_by_outcome": _count(a["outcome"] for a in attempts),
            "admission_closed_s": {"median": statistics.median(closed) if closed else 0.0,
                                   "p90": percentile(closed, 0.9), "max": max(closed, default=0.0)},
            "trainer_wait_s_total": round(sum(a["trainer_wait_s"] for a in attempts), 3),
        })
        data["modes"][mode] = summary
        tok, steps = summary["rollout_tokens_per_s"], summary["train_steps_per_min"]
        rows.append([f"{label} / off ({mode}), median (low-high)", _shown(tok), _shown(steps), "", ""])
        notes.append(
            f"{mode}: {len(attempts)} attempts over {args.pairs} 'on' runs ({summary['attempts_by_outcome']}); "
            f"admission closed median {summary['admission_closed_s']['median']:.3f}s, max "
            f"{summary['admission_closed_s']['max']:.3f}s; the trainer waited {summary['trainer_wait_s_total']:.2f}s "
            "in all.")
    first = data["modes"][modes[0]]
    # The single-pair keys earlier reports and readers use, for the first mode.
    data["ratio_rollout_tokens_per_s"] = first["rollout_tokens_per_s"]["median"]
    data["ratio_train_steps_per_min"] = first["train_steps_per_min"]["median"]
    table = markdown_table(["run", "rollout tok/s", "train steps/min", "wall s", "reward last 10"], rows)
    notes.append(f"Pairs alternate the order (off first, then on first); ratios are taken within each pair. "
                 f"{args.steps} steps a run, " + _cadence(args) + ".")
    notes.append("What an 'on' run pays: with parked agents, rollouts stop while admission is closed; with either "
                 "kind, the Temporal dev server and the snapshot's own work share the two cores with vLLM and the "
                 "trainer.")
    return BenchResult("overhead", table, data, notes)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "low": round(min(values), 3),
            "high": round(max(values), 3), "pairs": [round(v, 3) for v in values]}


def _shown(spread: dict[str, float]) -> str:
    return f"{spread['median']:.3f} ({spread['low']:.3f}-{spread['high']:.3f})"


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts
