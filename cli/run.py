"""`turnkeep run`: train, on the embedded default or on what the config names; the same command resumes."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from turnkeep.cli.config_args import add_config_args, checked_config
from turnkeep.config.loader import ConfigError


def add_run_parser(subparsers) -> None:
    run = subparsers.add_parser("run", help="train on the embedded default (local Ray, vLLM, environment server)")
    add_config_args(run)
    run.add_argument("--steps", type=int, help="stop after this many train steps and exit 0")
    run.add_argument("--run-dir", type=Path, help="overrides run.run_dir")


def run_run(args: argparse.Namespace) -> int:
    try:
        cfg = checked_config(args, **{"run.steps": args.steps,
                                      "run.run_dir": None if args.run_dir is None else str(args.run_dir)})
    except ConfigError as err:
        print(f"turnkeep: {err}", file=sys.stderr)
        return 2
    from turnkeep.workers.ray_cluster.security import apply_ray_environment

    # Before anything imports Ray: it reads its address and authentication settings at import.
    apply_ray_environment(cfg)
    from turnkeep.controller.errors import RunStopped
    from turnkeep.controller.restore.crash_restore import CrashRestoreError
    from turnkeep.controller.restore.run_identity import RunDirError
    from turnkeep.controller.restore.unusable import UnusableRunDir
    from turnkeep.workers.preemption import preempted_line
    from turnkeep.workers.run_session import run_training
    from turnkeep.workers.temporal.controller_worker import RecoveryFailed

    try:
        summary = asyncio.run(run_training(cfg, cfg.run.steps))
    except (RunDirError, ConfigError) as err:
        print(f"turnkeep: {err}", file=sys.stderr)
        return 2
    except (RecoveryFailed, UnusableRunDir, CrashRestoreError) as err:
        print(f"turnkeep: the run could not be resumed: {err}", file=sys.stderr)
        return 2
    except RunStopped as err:
        print(f"turnkeep: the run was stopped: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("turnkeep: interrupted", file=sys.stderr)
        return 130
    if summary.preempted is not None:
        print(f"\n{preempted_line(summary.steps, summary.preempted)}", flush=True)
        return 0
    last = summary.last_metrics or {}
    print(
        f"\nturnkeep: {steps_done(summary)} in {summary.wall_s:.0f}s; last reward {last.get('reward_mean')}; "
        f"peak memory of the run's processes {summary.peak_rss_mib / 1024:.2f} GiB; "
        f"metrics in {summary.run_dir / 'metrics.jsonl'}, checkpoints in {summary.run_dir / 'checkpoints'}"
    )
    return 0


def steps_done(summary) -> str:
    """The steps this process trained; where the run began past 0 (a restore), the range."""
    trained = summary.steps if summary.steps_trained is None else summary.steps_trained
    if trained == summary.steps:
        return f"{trained} steps"
    if trained == 0:
        return f"no new step (the run is at step {summary.steps})"
    return f"{trained} steps ({summary.steps - trained + 1} to {summary.steps}; the run is at step {summary.steps})"
