"""`turnkeep eval --model DIR`: a model's held-out score without training (`workers/heldout_eval.py`);
`turnkeep eval --run-dir D`: a running run evaluates the weights of its current step now (the run workflow's
`evaluate_now` signal; the result is a `"kind": "eval"` line of its metrics.jsonl)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from turnkeep.cli.config_args import add_config_args, checked_config
from turnkeep.config.loader import ConfigError


def add_eval_parser(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="score a model (a folder or hub id), or a running run's current "
                                                "weights, on held-out problems")
    add_config_args(parser)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--model", help="model folder (an export, a base model) or hub id")
    target.add_argument("--run-dir", type=Path, help="the run directory of a running `turnkeep run`: it evaluates "
                                                     "its current weights beside training ([eval] settings)")
    parser.add_argument("--wait", action="store_true", help="with --run-dir: wait for the evaluation's line")
    parser.add_argument("--prompts", type=Path, help="prompts file (default: eval.prompts, else the held-out "
                                                     "problems of the config's tool_chat reasoning-gym tasks)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (pass@k for k up to it)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--limit", type=int, help="score only the first N prompts")
    parser.add_argument("--out", type=Path, help="also write the result here as JSON")


def run_eval(args: argparse.Namespace) -> int:
    if args.run_dir is not None:
        from turnkeep.cli.eval_live import ask_running_run  # late: only this path talks to Temporal

        return ask_running_run(args.run_dir, wait=args.wait)
    try:
        if args.samples < 1 or (args.limit is not None and args.limit < 1):
            raise ConfigError("--samples and --limit must be at least 1")
        cfg = checked_config(args, **{"model.path": args.model})
        from turnkeep.workers.eval_problems import eval_problems  # late: reads the task's datasets

        problems = eval_problems(cfg, args.prompts or cfg.eval.prompts, args.limit)
    except ConfigError as err:
        print(f"turnkeep eval: {err}", file=sys.stderr)
        return 2
    from turnkeep.workers.heldout_eval import EvalSettings, evaluate  # late: loads vLLM

    settings = EvalSettings(samples=args.samples, temperature=args.temperature)
    result = asyncio.run(evaluate(cfg, Path(cfg.model.path), problems, settings))
    print(result.line(), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"model": str(cfg.model.path), **result.__dict__}, indent=2) + "\n")
    return 0
