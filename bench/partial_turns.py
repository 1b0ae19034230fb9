"""Partial turns: what a kill mid-turn costs at the `turn` and at the `token` level, on the long-turn config.

Two chaos runs of random kills, one per level, both streaming their turns (`env.stream_turns`)
so the audit log counts the tokens of every turn a kill cut: at `turn` level all of them are
generated again, at `token` level all but those after the last journaled chunk. Then the
cost of journaling a turn's tokens as they stream, without kills: `turn` (no streaming) and
`token` runs in alternating pairs, rollout tokens/s compared within each pair.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from turnkeep.bench.chaos_report import chaos_figures, chaos_run
from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import run_turnkeep, throughput

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "long_turns.toml"
LEVELS = ("turn", "token")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="default: configs/long_turns.toml")
    parser.add_argument("--kills", type=int, default=20, help="random kills of each chaos run (default 20)")
    parser.add_argument("--chaos-steps", type=int, default=150,
                        help="train steps of each chaos run (default 150: room for 20 kills and a last stretch)")
    parser.add_argument("--max-delay-s", type=float, default=15.0,
                        help="kills land 0.5 s to this long after a train step (default 15)")
    parser.add_argument("--seed", type=int, default=36, help="the chaos runs' kill schedule (default 36)")
    parser.add_argument("--pairs", type=int, default=3, help="alternating turn/token runs without kills (default 3)")
    parser.add_argument("--steps", type=int, default=40, help="train steps of each run without kills (default 40)")
    parser.add_argument("--chaos-save-period", type=int, default=2,
                        help="train.save_period of the chaos runs (default 2): kills come every few steps, and a "
                             "longer period would leave every restart without a checkpoint to restore from")
    parser.add_argument("--skip-chaos", action="store_true", help="only the runs without kills")
    parser.add_argument("--skip-cost", action="store_true", help="only the chaos runs")


def run(args: argparse.Namespace) -> BenchResult:
    base = args.out / "partial_turns"
    chaos = {} if args.skip_chaos else {level: _chaos_run(args, base / f"chaos-{level}", level) for level in LEVELS}
    cost = None if args.skip_cost else _cost_pairs(args, base)
    rows = [[f"chaos at `{level}` level", *_chaos_row(report, args.kills)] for level, report in chaos.items()]
    table = markdown_table(["run", "kills", "invariants", "restores (snapshot / checkpoint / fresh)",
                            "tokens generated again (share)", "per kill", "cut turns: tokens reported (engines' count) / kept",
                            "restart -> first generation, median s"], rows)
    if cost is not None:
        cost_rows = [[name, r["rollout_tokens_per_s"], r["train_steps_per_min"], r["reward_last10"]]
                     for name, r in cost["runs"].items()]
        cost_rows.append(["token / turn, median (low-high)", _shown(cost["ratio"]), "", ""])
        table += "\n\n" + markdown_table(["run without kills", "rollout tok/s", "train steps/min", "reward last 10"],
                                         cost_rows)
    notes = [
        "Tokens generated again: turns a later incarnation committed again, plus the tokens of turns a kill cut "
        "mid-generation that no continuation kept, by the engines' own count (every token each engine generated "
        "per incarnation, `primitives.token_tally`, less the tokens of committed turns: to the last token). Share "
        "of every token the engines generated.",
        "At `token` level a cut turn goes on from its journaled tokens: a kill loses only what streamed after the "
        "last chunk (`env.journal_partial_tokens` tokens or `env.journal_partial_s`, whichever came first) and "
        "what the journal's batch had not yet made durable (`env.journal_flush_s`).",
        "Cut turns: the tokens the turns' progress reports saw (`turn_tokens` lines of the audit log, up to the "
        "last chunk) and in brackets the engines' own count, which includes what streamed after the last chunk; "
        "at `token` level that tail is exactly what a kill loses.",
        f"The chaos runs checkpoint every {args.chaos_save_period} train steps, so a restart restores the newest "
        "snapshot (its trainer checkpoint and the journals' mark) and continues cut turns from tokens an older "
        "policy version generated.",
    ]
    if cost is not None:
        notes.append(f"Journaling cost: {args.pairs} alternating pairs of {args.steps}-step runs without kills, `turn` "
                     "(whole turns, not streamed) against `token` (streamed, journaled in chunks); the ratio is taken "
                     "within each pair.")
    data = {"chaos": {level: chaos_figures(report) for level, report in chaos.items()}, "cost": cost}
    return BenchResult("partial_turns", table, data, notes)


def _chaos_run(args: argparse.Namespace, run_dir: Path, level: str) -> dict:
    chaos_args = ["--kills", str(args.kills), "--steps", str(args.chaos_steps), "--seed", str(args.seed),
                  "--max-delay-s", str(args.max_delay_s)]
    return chaos_run("partial_turns", run_dir, args.config, chaos_args,
                     [*args.set, f"rollout_recovery.target_level={level}", "env.stream_turns=true",
                      f"train.save_period={args.chaos_save_period}"])


def _chaos_row(report: dict, _kills: int) -> list:
    f = chaos_figures(report)
    sources = f["restores_by_source"]
    restores = f"{sources.get('snapshot', 0)} / {sources.get('trainer_checkpoint', 0)} / {sources.get('fresh', 0)}"
    return [f["kills"], "all hold" if f["ok"] else "BROKEN", restores,
            f"{f['tokens_regenerated']} of {f['tokens_generated']} ({f['share']:.3%})", f["per_kill"],
            f"{f['cut_turn_tokens']} ({f['engine_cut_tokens']}) / {f['cut_turn_tokens_kept']}", f["restart_median_s"]]


def _cost_pairs(args: argparse.Namespace, base: Path) -> dict:
    common = [*args.set, "temporal.port=0", "temporal.ui_port=0"]
    runs: dict[str, dict] = {}
    for pair in range(1, args.pairs + 1):
        for level in (LEVELS if pair % 2 else tuple(reversed(LEVELS))):
            run_dir = base / f"{level}-{pair}"
            print(f"bench partial_turns: pair {pair}, {level}: {args.steps} steps in {run_dir}", flush=True)
            run_turnkeep(run_dir, args.config, args.steps, [*common, f"rollout_recovery.target_level={level}"],
                         base / f"{level}-{pair}.log")
            runs[f"{level} #{pair}"] = throughput(run_dir)
    ratios = [runs[f"token #{p}"]["rollout_tokens_per_s"] / runs[f"turn #{p}"]["rollout_tokens_per_s"]
              for p in range(1, args.pairs + 1)]
    return {"runs": runs, "ratio": {"median": round(statistics.median(ratios), 3), "low": round(min(ratios), 3),
                                    "high": round(max(ratios), 3), "pairs": [round(r, 3) for r in ratios]}}


def _shown(spread: dict) -> str:
    return f"{spread['median']:.3f} ({spread['low']:.3f}-{spread['high']:.3f})"
