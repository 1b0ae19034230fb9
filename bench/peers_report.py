"""The table and notes of `turnkeep bench peers` (figures: `bench/peers_figures.py`)."""

from __future__ import annotations

import argparse
import statistics

from turnkeep.bench.peers_figures import reward_at
from turnkeep.bench.report import BenchResult, markdown_table


def _median(values: list, key: str) -> float | None:
    found = [value[key] for value in values if value[key] is not None]
    return round(statistics.median(found), 3) if found else None


def report(args: argparse.Namespace, figures: dict[str, list[dict]], kills: dict[str, list[dict]], target: float,
           trl_version: str, cfg) -> BenchResult:
    fixed_s = min(min(f["wall_s"] for f in found) for found in figures.values())
    rows = []
    for side, found in figures.items():
        name = "turnkeep" if side == "turnkeep" else f"TRL {trl_version} GRPOTrainer"
        at_fixed = [reward_at(f, fixed_s) for f in found]
        rows.append([name, _median(found, "wall_s"), _median(found, "first_step_s"), _median(found, "to_target_s"),
                     statistics.median(r for r in at_fixed if r is not None) if any(at_fixed) else "",
                     _median(found, "reward_last5"), _median(found, "tokens_per_s"), _median(found, "steps_per_min"),
                     _median(found, "peak_rss_mib"), _median(kills[side], "steps_lost"),
                     _median(kills[side], "restart_to_next_step_s")])
    table = markdown_table(["framework", "wall s", "first step s", f"s to reward {target}",
                            f"reward at {fixed_s:.0f} s", "reward (last 5)", "generated tok/s", "train steps/min",
                            "peak RSS MiB", "steps lost to a kill", "restart to next step s"], rows)
    notes = [
        f"{args.pairs} pair(s) of {args.steps}-step runs per framework, alternating, then one run each SIGKILLed after "
        f"{args.steps // 2} steps and started again (turnkeep: the same command; TRL: resume_from_checkpoint); "
        f"checkpoints every {args.save_steps} steps on both. The same tiny chat model, {cfg.train.prompts_per_step} "
        f"prompts x {cfg.rollout.group_size} samples a step, lr {cfg.train.lr}, temperature {cfg.rollout.temperature}, "
        f"{cfg.rollout.max_tokens_per_turn} tokens at most, token-mean loss with group-std advantages, clip 0.2.",
        "Rewards are 5-step moving means; times run from the command (model loading and, for turnkeep, Ray, "
        "Temporal and vLLM starting included). TRL generates with transformers on the trainer's process (no vLLM "
        "server here) and trains on-policy; turnkeep generates with vLLM beside training, up to "
        f"{cfg.train.max_staleness} versions stale. The peak RSS is TRL's one process against turnkeep's whole tree.",
        "Steps lost: the kill's step less the step the restart trained first, less one. turnkeep restores from its "
        "newest snapshot and keeps every finished turn; TRL from its newest checkpoint, regenerating everything.",
    ]
    data = {"figures": figures, "kills": kills, "target_reward": target, "fixed_s": fixed_s, "trl": trl_version}
    return BenchResult("peers", table, data, notes)
