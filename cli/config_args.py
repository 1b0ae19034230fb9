"""The config arguments several commands share (`--config`, `--set`), and loading them into one checked config."""

from __future__ import annotations

import argparse
from pathlib import Path

from turnkeep.config.loader import load_config, parse_overrides
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.model_source import with_model_resolved
from turnkeep.workers.startup_checks import check_before_start

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="TOML config (default: configs/tiny.toml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")


def checked_config(args: argparse.Namespace, **overrides: object) -> TurnkeepConfig:
    """The config `--config` and `--set` (then `overrides`, where not None) give, its hub model resolved to a folder
    and checked before anything starts; raises ConfigError with the one-line reason."""
    settings = parse_overrides(args.set)
    settings.update({key: value for key, value in overrides.items() if value is not None})
    cfg = with_model_resolved(load_config(args.config, settings))
    check_before_start(cfg)
    return cfg
