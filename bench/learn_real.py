"""`turnkeep bench learn_real`: `bench learn` on the real model recipe, `configs/smollm2.toml` (SmolLM2-135M-Instruct
from its package, one-digit sums, RL alone; docs/real_model.md): held-out pass@1 before and after, the reward curve,
wall time, step seconds, tokens/s, the export scored on the same problems."""

from __future__ import annotations

import argparse
from pathlib import Path

from turnkeep.bench import learn
from turnkeep.bench.report import BenchResult

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "smollm2.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    learn.add_arguments(parser, config=CONFIG, steps=24, eval_prompts=64, samples=2, eval_every=8, cost_pairs=0)


def run(args: argparse.Namespace) -> BenchResult:
    return learn.run(args, name="learn_real")
