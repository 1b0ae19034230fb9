"""`turnkeep chaos`: its command line (the tool itself is `chaos/`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from turnkeep.chaos.schedule import ALL_MOMENTS, RANDOM
from turnkeep.chaos.targets import TARGETS
from turnkeep.cli.config_args import DEFAULT_CONFIG


def add_chaos_parser(subparsers) -> argparse.ArgumentParser:
    chaos = subparsers.add_parser("chaos", help="kill a run many times at chosen points, then check the invariants")
    chaos.add_argument("--run-dir", type=Path, required=True, help="a new (or empty) run directory")
    chaos.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="TOML config (default: configs/tiny.toml)")
    chaos.add_argument("--kills", type=int, default=20, help="how many times to kill the run (default 20)")
    chaos.add_argument("--target", default="all",
                       help=f"comma list of what to kill: {', '.join(TARGETS)}, or every (all of them but rank and "
                            "freeze-rank, which need train.ranks > 1) (default: all, the whole process tree)")
    chaos.add_argument("--at", default=RANDOM,
                       help=f"comma list of moments: {', '.join(ALL_MOMENTS)} (default: random; the phases wait at "
                            "a hook in the product)")
    chaos.add_argument("--points", default=None, help="the older name of --at")
    chaos.add_argument("--steps", type=int, default=200, help="train steps of the whole run (default 200)")
    chaos.add_argument("--seed", type=int, help="seed of the kill schedule and timing (default: random, reported)")
    chaos.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="config override passed to every `turnkeep run`")
    chaos.add_argument("--max-delay-s", type=float, default=None,
                       help="a random moment falls 0.5 s to this many seconds after a train step (default: two "
                            "snapshot intervals of the config, at least 12), so some incarnations live to publish")
    chaos.add_argument("--phase-timeout-s", type=float, default=300.0,
                       help="give up waiting for a point after this long and kill anyway (default 300)")
    chaos.add_argument("--final-timeout-s", type=float, default=3600.0,
                       help="how long the last, undisturbed run may take to finish (default 3600)")
    chaos.add_argument("--recheck", action="store_true",
                       help="check the invariants of the earlier chaos run in --run-dir again with this version's "
                            "checker and rewrite its report's verdict; nothing is run or killed")
    return chaos
