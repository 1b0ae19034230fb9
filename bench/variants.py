"""`turnkeep bench variants`: the losses researchers follow, on the `tool_chat` task with the tiny chat model: one
run per variant of `[algorithm]`, the same seed, steps and config otherwise; each run's reward curve (the mean of
each tenth of its steps), the last ten steps' reward, its held-out pass@1 at the last step (`[eval]`), train
steps/min, and what the variant's own metrics say (groups dropped for zero signal, KL to the reference)."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import metric_lines, run_turnkeep, throughput

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tool_chat.toml"
VARIANTS: dict[str, list[str]] = {
    "grpo": ["algorithm.advantage=grpo", "algorithm.scale_rewards=group", "algorithm.loss_agg=seq_mean_token_mean"],
    "dr_grpo": ["algorithm.advantage=grpo", "algorithm.scale_rewards=none", "algorithm.loss_agg=constant"],
    "dapo": ["algorithm.advantage=grpo", "algorithm.scale_rewards=group", "algorithm.loss_agg=token_mean",
             "algorithm.clip_low=0.2", "algorithm.clip_high=0.28", "algorithm.drop_zero_signal=true"],
    "rloo": ["algorithm.advantage=rloo", "algorithm.loss_agg=token_mean"],
    "grpo + kl": ["algorithm.advantage=grpo", "algorithm.scale_rewards=group",
                  "algorithm.loss_agg=seq_mean_token_mean", "algorithm.kl_coef=0.05", "algorithm.kl_estimator=k3"],
}
"""Each variant's `[algorithm]` settings (docs/algorithms.md gives each formula and its paper)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=60, help="train steps of each run (default 60)")
    parser.add_argument("--only", default=",".join(VARIANTS), help=f"variants to run (default: {','.join(VARIANTS)})")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)


def run(args: argparse.Namespace) -> BenchResult:
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown or not names or args.steps < 10:
        raise SystemExit(f"bench variants: --only names {', '.join(VARIANTS)} (not {', '.join(unknown) or 'none'}); "
                         "--steps at least 10")
    common = [*args.set, "temporal.port=0", "temporal.ui_port=0", "eval.before_training=false",
              f"eval.every_steps={args.steps}"]
    found = {}
    for name in names:
        run_dir = args.out / "variants" / name.replace(" + ", "-")
        run_turnkeep(run_dir, args.config, args.steps, [*common, *VARIANTS[name]], run_dir.parent / f"{run_dir.name}.log")
        found[name] = measure(run_dir)
    return _report(args, found)


def measure(run_dir: Path) -> dict:
    steps = metric_lines(run_dir, "train_step")
    rewards = [line["reward_mean"] for line in steps]
    tenth = max(1, len(rewards) // 10)
    evals = metric_lines(run_dir, "eval")
    kl = [line["trainer_kl_reference"] for line in steps if "trainer_kl_reference" in line]
    return {**throughput(run_dir),
            "curve": [round(statistics.fmean(rewards[i:i + tenth]), 3) for i in range(0, tenth * 10, tenth)
                      if rewards[i:i + tenth]],
            "pass@1": evals[-1]["pass@1"] if evals else None,
            "zero_signal_dropped": max((line.get("groups_zero_signal_total", 0) for line in steps), default=0),
            "kl_reference_last": kl[-1] if kl else None}


def _report(args: argparse.Namespace, found: dict[str, dict]) -> BenchResult:
    rows = [[name, " ".join(f"{value:.2f}" for value in r["curve"]), r["reward_first10"], r["reward_last10"],
             r["pass@1"] if r["pass@1"] is not None else "", r["train_steps_per_min"], r["zero_signal_dropped"],
             r["kl_reference_last"] if r["kl_reference_last"] is not None else ""] for name, r in found.items()]
    table = markdown_table(["variant", "reward curve (tenths)", "reward (first 10)", "reward (last 10)",
                            "held-out pass@1 (last step)", "train steps/min", "groups dropped (zero signal)",
                            "KL to reference (last step)"], rows)
    notes = [f"One run per variant, {args.steps} steps of {args.config.name} (seed, model and every other setting "
             "the same); settings: " + "; ".join(f"{name}: {' '.join(VARIANTS[name])}" for name in found),
             "One seed each: the curves show what each variant does on this task, not a ranking with error bars."]
    return BenchResult("variants", table, {"runs": found, "steps": args.steps}, notes)
