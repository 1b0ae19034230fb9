"""`turnkeep eval --model DIR`: a model's held-out score without training (`workers/heldout_eval.py`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from turnkeep.cli.config_args import add_config_args, checked_config
from turnkeep.config.loader import ConfigError
from turnkeep.schemas.rollout import Problem, PromptRecord


def add_eval_parser(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="score a model (a folder or hub id) on held-out problems")
    add_config_args(parser)
    parser.add_argument("--model", required=True, help="model folder (an export, a base model) or hub id")
    parser.add_argument("--prompts", type=Path, help="prompts file (default: the held-out problems of the "
                                                     "config's tool_chat reasoning-gym tasks)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (pass@k for k up to it)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--limit", type=int, help="score only the first N prompts")
    parser.add_argument("--out", type=Path, help="also write the result here as JSON")


def run_eval(args: argparse.Namespace) -> int:
    try:
        if args.samples < 1 or (args.limit is not None and args.limit < 1):
            raise ConfigError("--samples and --limit must be at least 1")
        cfg = checked_config(args, **{"model.path": args.model})
        problems = _problems(cfg, args.prompts, args.limit)
    except ConfigError as err:
        print(f"turnkeep eval: {err}", file=sys.stderr)
        return 2
    from turnkeep.workers.heldout_eval import EvalSettings, evaluate

    settings = EvalSettings(samples=args.samples, temperature=args.temperature)
    result = asyncio.run(evaluate(cfg, Path(cfg.model.path), problems, settings))
    print(result.line(), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"model": str(cfg.model.path), **result.__dict__}, indent=2) + "\n")
    return 0


def _problems(cfg, prompts: Path | None, limit: int | None) -> list[Problem]:
    from turnkeep.controller.state.prompt_files import PromptFile
    from turnkeep.workers.prompts import heldout_source

    source = PromptFile(prompts, env_names=cfg.environments.keys()) if prompts is not None else heldout_source(cfg)
    if source is None:
        raise ConfigError("no held-out problems: the config has no tool_chat environment with reasoning_gym tasks; "
                          "give --prompts FILE")
    count = source.size if limit is None else min(limit, source.size)
    return [_problem(source.record(i), cfg) for i in range(count)]


def _problem(record: PromptRecord, cfg) -> Problem:
    env = record.env
    if env is None:
        if len(cfg.environments) != 1:
            raise ConfigError(f"a prompt names no env and the config has {len(cfg.environments)} environments; "
                              "give each record an \"env\"")
        [env] = cfg.environments
    return Problem(question=record.prompt, answer=record.answer, env=env, metadata=record.metadata)
