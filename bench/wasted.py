"""Wasted attempts: a slow participant makes the Gym phase longer than a train step (the
peer's failure case). With the trainer hold, the next optimizer step waits and the
attempt counts; without it (the peer's behaviour) the step lands during the Gym phase
and the attempt is thrown away at the cut."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from turnkeep.bench.overhead import DEFAULT_CONFIG
from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import metric_lines, run_turnkeep, throughput

THROWN_AWAY = "trainer_state_changed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=80, help="train steps of each run (default 80)")
    parser.add_argument("--prepare-delay-s", type=float, default=3.0,
                        help="extra seconds the environment server takes to prepare (the slow participant)")
    parser.add_argument("--interval-s", type=float, default=5.0, help="snapshot interval")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)


def run(args: argparse.Namespace) -> BenchResult:
    slow = ['env.fault_injection=true', f'env.startup_faults={{"delay_s": {{"prepare": {args.prepare_delay_s}}}}}']
    # Parked agents: the Gym phase (prepare, commit) is where the slow participant costs; journaled agents have none.
    common = [*args.set, *slow, "temporal.port=0", "temporal.ui_port=0", "snapshot.agents=parked",
              f"snapshot.attempt_interval_s={args.interval_s}", "snapshot.checkpoint_on_demand=true"]
    results = {}
    for label, hold in (("trainer hold", True), ("no hold (peer)", False)):
        run_dir = args.out / "wasted" / ("hold" if hold else "no-hold")
        print(f"bench wasted: {label}: {args.steps} steps in {run_dir}", flush=True)
        run_turnkeep(run_dir, args.config, args.steps, [*common, f"snapshot.trainer_hold={str(hold).lower()}"],
                     args.out / "wasted" / f"{run_dir.name}.log")
        attempts = metric_lines(run_dir, "snapshot")
        gym = [a for a in attempts if "gym_prepare" in a["phase_s"]]
        if not gym:
            raise SystemExit(f"bench wasted: {label}: none of the {len(attempts)} snapshot attempts of {run_dir} had "
                             "a Gym phase, so there is nothing to compare; a --set of snapshot.agents other than "
                             "parked, or too few --steps for one attempt, does that")
        thrown = [a for a in gym if THROWN_AWAY in a["reason"]]
        published = [a for a in gym if a["outcome"].startswith("published")]
        closed = [a["admission_closed_s"] for a in gym]
        results[label] = {
            "run_dir": str(run_dir), "attempts_with_gym_phase": len(gym), "published": len(published),
            "thrown_away": len(thrown), "trainer_wait_s_total": round(sum(a["trainer_wait_s"] for a in gym), 2),
            "admission_closed_s_median": round(statistics.median(closed), 3) if closed else 0.0,
            "admission_closed_s_wasted": round(sum(a["admission_closed_s"] for a in thrown), 2),
            **{k: v for k, v in throughput(run_dir).items() if k in ("train_steps_per_min", "rollout_tokens_per_s")},
        }
    rows = [[label, r["attempts_with_gym_phase"], r["published"], r["thrown_away"], r["trainer_wait_s_total"],
             r["admission_closed_s_median"], r["admission_closed_s_wasted"], r["train_steps_per_min"]]
            for label, r in results.items()]
    table = markdown_table(["mode", "attempts", "published", "thrown away", "trainer wait s (total)",
                            "admission closed s / attempt", "closed s wasted", "train steps/min"], rows)
    notes = [
        f"The environment server's prepare takes {args.prepare_delay_s:g}s longer than it needs (a fault plan), "
        "longer than one train step here.",
        "With the hold the trainer pays the Gym phase once per attempt and every attempt counts; without it the "
        "generation pause is paid and the attempt is thrown away whenever a step lands inside it.",
    ]
    return BenchResult("wasted", table, {"runs": results, "prepare_delay_s": args.prepare_delay_s}, notes)
