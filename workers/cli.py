"""`turnkeep`: the command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from controller.config_file import ConfigError, load_config, parse_overrides
from workers.bench_cli import add_bench_parser, run_bench
from workers.chaos import add_chaos_parser, run_chaos
from workers.env_server import add_env_server_parser, run_env_server
from workers.plot_cli import add_plot_parser, run_plot
from workers.startup_checks import check_before_start
from workers.status_cli import add_status_parser, run_status

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnkeep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train on the embedded default (local Ray, vLLM, environment server)")
    run.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="TOML config (default: configs/tiny.toml)")
    run.add_argument("--steps", type=int, help="stop after this many train steps and exit 0")
    run.add_argument("--run-dir", type=Path, help="overrides run.run_dir")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    add_chaos_parser(sub)
    add_bench_parser(sub)
    add_env_server_parser(sub)
    add_status_parser(sub)
    add_plot_parser(sub)
    make = sub.add_parser("make-model", help="make (or find cached) the tiny model and print its directory")
    make.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    make.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.command == "chaos":
        return run_chaos(args)
    if args.command == "bench":
        return run_bench(args, list(argv if argv is not None else sys.argv[1:]))
    if args.command == "env-server":
        return run_env_server(args)
    if args.command == "status":
        return run_status(args)
    if args.command == "plot":
        return run_plot(args)
    try:
        overrides = parse_overrides(args.set)
        if getattr(args, "steps", None) is not None:
            overrides["run.steps"] = args.steps
        if getattr(args, "run_dir", None) is not None:
            overrides["run.run_dir"] = str(args.run_dir)
        cfg = load_config(args.config, overrides)
        check_before_start(cfg)
    except ConfigError as err:
        print(f"turnkeep: {err}", file=sys.stderr)
        return 2
    if args.command == "make-model":
        from gpu_workers.tiny_model.build import ensure_tiny_model
        from gpu_workers.tiny_model.transcripts import demonstration_source

        print(ensure_tiny_model(cfg.model, cfg.task, cfg.run.seed, demonstrations=demonstration_source(cfg)))
        return 0
    return _run(cfg)


def _run(cfg) -> int:
    from workers.ray_security import apply_ray_environment

    # Before anything imports Ray: it reads its address and authentication settings at import.
    apply_ray_environment(cfg)
    from controller.restore.crash_restore import CrashRestoreError
    from controller.restore.restore_source import UnusableRunDir
    from controller.runtime import RunStopped
    from controller.stores.run_dir import RunDirError
    from workers.controller_worker import RecoveryFailed
    from workers.run_session import run_training

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
        print(f"\nturnkeep: preempted at step {summary.steps}; saved {summary.preempted}. "
              f"Run the same command again (same --run-dir) to continue.", flush=True)
        return 0
    last = summary.last_metrics or {}
    print(
        f"\nturnkeep: {summary.steps} steps in {summary.wall_s:.0f}s; last reward {last.get('reward_mean')}; "
        f"peak memory of the run's processes {summary.peak_rss_mib / 1024:.2f} GiB; "
        f"metrics in {summary.run_dir / 'metrics.jsonl'}, checkpoints in {summary.run_dir / 'checkpoints'}"
    )
    return 0


QUICK_EXIT_COMMANDS = frozenset({"status"})
"""Short-lived commands that leave without the interpreter's finalization. `status` asks Temporal with a deadline;
a call that outlives it completes on the client's Rust threads while Python finalizes, and Python aborts the
process ("Fatal Python error: PyGILState_Release", SIGABRT) after the report was already printed."""


def entry() -> None:
    """The `turnkeep` command (and `python -m workers.cli`); `main` stays callable in-process."""
    code = main()
    if len(sys.argv) > 1 and sys.argv[1] in QUICK_EXIT_COMMANDS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
