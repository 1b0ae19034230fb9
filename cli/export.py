"""`turnkeep export --run-dir D [--step N] --out DIR`: a trainer checkpoint of a run as a Hugging Face model folder
(weights in the run's dtype, config, tokenizer, chat template, generation config), from a checkpoint written by any
number of trainer ranks. What it writes and refuses: `workers.export`."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]B)?$", re.IGNORECASE)
UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def add_export_parser(subparsers) -> argparse.ArgumentParser:
    export = subparsers.add_parser("export", help="a trainer checkpoint as a Hugging Face model folder")
    export.add_argument("--run-dir", type=Path, required=True,
                        help="the run directory (run.run_dir / --run-dir of `turnkeep run`)")
    export.add_argument("--step", type=int, default=None,
                        help="the trainer checkpoint of this train step (default: the newest)")
    export.add_argument("--out", type=Path, required=True, help="the folder to write: new, or empty")
    export.add_argument("--max-shard-size", type=shard_size, default=shard_size("5GB"), metavar="SIZE",
                        help="split the weights into files of at most this size (e.g. 2GB, 500MB; default 5GB)")
    return export


def shard_size(text: str) -> int:
    """`5GB`, `500MB`, `2.5GB` or a byte count, in bytes (decimal units, as Hugging Face counts them)."""
    match = SIZE.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is no size; give bytes or a number with KB, MB, GB or TB")
    number, unit = match.groups()
    return int(float(number) * UNITS[unit.upper()] if unit else float(number))


def run_export(args: argparse.Namespace) -> int:
    # torch, DCP and transformers: loaded by this command's run only, not by `turnkeep --help`
    from turnkeep.workers.export import ExportRefused, export_checkpoint

    try:
        done = export_checkpoint(args.run_dir, args.out, args.step, args.max_shard_size)
    except ExportRefused as err:
        print(f"turnkeep export: {err}", file=sys.stderr)
        return 2
    print(done.line(args.run_dir), flush=True)
    return 0
