"""`turnkeep make-model`: make (or find cached) the tiny model a config asks for, and print its directory."""

from __future__ import annotations

import argparse
import sys

from turnkeep.cli.config_args import add_config_args, checked_config
from turnkeep.config.loader import ConfigError


def add_make_model_parser(subparsers) -> None:
    make = subparsers.add_parser("make-model", help="make (or find cached) the tiny model and print its directory")
    add_config_args(make)


def run_make_model(args: argparse.Namespace) -> int:
    try:
        cfg = checked_config(args)
        from turnkeep.workers.model_maker import tiny_model_dir

        print(tiny_model_dir(cfg))  # a model.path on a cluster's node is checked only where it is loaded
    except ConfigError as err:
        print(f"turnkeep: {err}", file=sys.stderr)
        return 2
    return 0
