"""`[train.lora]` against full fine-tuning: runs of the same config with every weight trained, with LoRA whose refit
sends the merged weights, and with LoRA whose refit sends the adapters alone (the engine serves them as a vLLM
LoRA), in alternating rounds so a drift of the machine's speed falls on each; per run the median refit's bytes and
seconds, the trainer's compute per step, train steps/min, the trainer checkpoint's size, the reward and peak
memory."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import metric_lines, run_turnkeep, throughput

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "tool_chat.toml"
VARIANTS = {
    "full": [],
    "lora merged": ["train.lora.refit=merged"],
    "lora adapters": ["train.lora.refit=adapters"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20, help="train steps of each run (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the three variants (default 2)")
    parser.add_argument("--rank", type=int, default=8, help="train.lora.rank of the LoRA runs (default 8)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)


def run(args: argparse.Namespace) -> BenchResult:
    if args.rounds < 1 or args.steps < 3:
        raise SystemExit("bench lora: --rounds at least 1 and --steps at least 3")
    common = [*args.set, "temporal.port=0", "temporal.ui_port=0", "eval.every_steps=0", "eval.before_training=false",
              f"train.save_period={args.steps}"]
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        for name, extra in VARIANTS.items():
            lora = [f"train.lora.rank={args.rank}"] if name != "full" else []
            run_dir = args.out / "lora" / f"{name.replace(' ', '-')}-{round_}"
            run_turnkeep(run_dir, args.config, args.steps, [*common, *lora, *extra], run_dir.parent / f"{run_dir.name}.log")
            runs[name].append(measure(run_dir, args.steps))
    return _report(args, runs)


def measure(run_dir: Path, steps: int) -> dict:
    lines = metric_lines(run_dir, "train_step")
    trainer = run_dir / "checkpoints" / f"step_{steps}" / "trainer"
    return {**throughput(run_dir),
            "refit_bytes": int(statistics.median(line["refit_bytes"] for line in lines)),
            "refit_s": round(statistics.median(line["refit_s"] for line in lines), 4),
            "compute_s": round(statistics.median(line["trainer_compute_s"] for line in lines), 4),
            "checkpoint_bytes": sum(p.stat().st_size for p in trainer.rglob("*") if p.is_file())}


def _report(args: argparse.Namespace, runs: dict[str, list[dict]]) -> BenchResult:
    keys = ("refit_bytes", "refit_s", "compute_s", "train_steps_per_min", "rollout_tokens_per_s",
            "checkpoint_bytes", "reward_last10", "peak_rss_tree_mib")
    median = {name: {key: statistics.median(r[key] for r in found) for key in keys} for name, found in runs.items()}
    rows = [[name, round(m["refit_bytes"] / 1e3, 1), round(m["refit_s"] * 1000, 1), round(m["compute_s"] * 1000),
             m["train_steps_per_min"], m["rollout_tokens_per_s"], round(m["checkpoint_bytes"] / 1e3),
             m["reward_last10"], m["peak_rss_tree_mib"]] for name, m in median.items()]
    table = markdown_table(["run", "refit KB", "refit ms", "trainer compute ms/step", "train steps/min",
                            "rollout tok/s", "checkpoint KB", "reward (last 10)", "peak RSS MiB"], rows)
    full, adapters = median["full"], median["lora adapters"]
    notes = [
        f"Medians of {args.rounds} alternating rounds of {args.steps} steps each on {args.config.name}, LoRA rank "
        f"{args.rank} on q, k, v and o; refit figures are each run's median step.",
        f"The adapter refit sends {adapters['refit_bytes'] / max(full['refit_bytes'], 1):.1%} of the full refit's "
        f"bytes in {adapters['refit_s'] / max(full['refit_s'], 1e-9):.0%} of its time: on a model this small the "
        "engine's LoRA load and its pause, cache clear and resume outweigh the bytes saved.",
        "The runs share train.lr: LoRA usually wants a learning rate about ten times full fine-tuning's, so its "
        "reward here is not what a tuned LoRA run reaches.",
    ]
    return BenchResult("lora", table, {"runs": runs, "median": median, "rank": args.rank, "steps": args.steps}, notes)
