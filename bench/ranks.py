"""`turnkeep bench ranks`: what a second trainer rank gives and costs, and what a rank's death costs the run.

First one trainer group of 1 and of 2 ranks on its own (`bench.rank_timings`): train step time on synthetic rows,
the refit's gather of the whole model onto rank 0, a checkpoint's save and load, each rank's peak memory. On 2
cores two ranks cannot be faster than one: each has half the rows but they share the cores, and every layer's
weights travel between them. Then a chaos run of the default task with 2 ranks in which one rank is SIGKILLed at
random moments: the seconds from each death to the next train step, the steps the restore undid, the tokens
generated again, and whether every invariant held.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import orjson

from turnkeep.bench.rank_timings import time_ranks
from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.config.loader import load_config

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
COUNTS = [1, 2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--steps", type=int, default=8, help="timed train steps per rank count (default 8)")
    parser.add_argument("--rows", type=int, default=32, help="rows per synthetic step (default 32)")
    parser.add_argument("--length", type=int, default=96, help="tokens per synthetic row (default 96)")
    parser.add_argument("--kills", type=int, default=4, help="rank kills of the chaos run (default 4)")
    parser.add_argument("--chaos-steps", type=int, default=120, help="train steps of the chaos run (default 120)")
    parser.add_argument("--seed", type=int, default=35, help="the chaos run's kill schedule (default 35)")
    parser.add_argument("--save-period", type=int, default=10,
                        help="train.save_period of the chaos runs: how far behind a checkpoint can be (default 10)")
    parser.add_argument("--skip-chaos", action="store_true", help="only the trainer groups on their own")


def run(args: argparse.Namespace) -> BenchResult:
    base = args.out / "ranks"
    cfg = load_config(args.config, dict(s.split("=", 1) for s in args.set))
    groups = time_ranks(cfg, base / "groups", COUNTS, args.steps, args.rows, args.length)
    rows = [[g["ranks"], "on" if g["copies"] else "off", g["step_s"], g["copy_s"] if g["copies"] else "",
             g["refit_gather_s"], g["save_s"], g["load_s"], f"{g['checkpoint_bytes'] / 2**20:.1f}",
             " / ".join(str(m) for m in g["peak_rss_mib_per_rank"]),
             f"{g['keeper_held_bytes'] / 2**20:.1f} / " + " / ".join(map(str, g["keeper_peak_rss_mib"]))
             if g["copies"] else ""]
            for g in groups.values()]
    table = markdown_table(["ranks", "rank copies", "train step s (median)", "of it copies s", "refit gather s",
                            "checkpoint save s", "checkpoint load s", "checkpoint MiB", "peak RSS MiB per rank",
                            "keepers: MiB held / peak RSS MiB each"], rows)
    deaths = {} if args.skip_chaos else {copies: _rank_deaths(args, base / f"chaos-copies-{copies}", copies)
                                         for copies in ("on", "off")}
    if deaths:
        table += "\n\n" + markdown_table(
            ["rank copies", "rank kills", "invariants", "death -> next train step s (median, max)",
             "steps undone (median, max)", "tokens generated again (share)"],
            [[copies, d["kills"], "all hold" if d["ok"] else "BROKEN", f"{d['repair_s_median']} ({d['repair_s_max']})",
              f"{d['undone_median']} ({d['undone_max']})",
              f"{d['tokens_regenerated']} of {d['tokens_generated']} ({d['share']:.3%})"]
             for copies, d in deaths.items()])
    one, two = groups["1"], groups["2"]
    dearer = [f"{n} rank(s) {groups[f'{n}+copies']['step_s'] / groups[str(n)]['step_s'] - 1:+.1%}" for n in COUNTS]
    notes = [
        f"Groups on their own: {args.steps} train steps of {args.rows} synthetic rows of {args.length} tokens on "
        f"the model of {args.config.name}; the step time is the median after the first (which builds the "
        f"optimizer state). Two ranks took {two['step_s'] / one['step_s']:.2f} of one rank's step time: each "
        f"computes with `train.torch_threads` = {cfg.train.torch_threads} thread(s), so two use two of this "
        "machine's cores, and every layer's weights travel between them. The memory figures are whole processes "
        "(torch and Ray's worker dominate them for a model this small); on GPUs each rank holds half of the "
        "weights, gradients and AdamW state.",
        "Refit gather: the whole model gathered onto rank 0's host memory one parameter at a time and packed as "
        "safetensors (what a refit hands the engines); with one rank, the state dict packed as is.",
        f"Rank copies (`train.rank_copies`): each step's shards copied to the keepers; the step time with them, "
        f"against without: {', '.join(dearer)}. The keepers hold two copies of each shard (its own keeper's and "
        "the next rank's; with one rank, one), so what they hold together is twice the weights and AdamW state "
        "in float32, plus the previous step's while a step's copies arrive.",
    ]
    if deaths:
        notes.append("Rank deaths: a chaos run of the default task with `train.ranks = 2`, one rank SIGKILLed at "
                     "a random moment after a train step each round, once with rank copies and once without (the "
                     "same kill schedule); the run replaces the whole group, restores into it and trains on with "
                     "the same engine and environment server. Steps undone: the steps the restore trained again "
                     f"(without copies, the trainer checkpoint it loaded was this far behind; `train.save_period` "
                     f"= {args.save_period} here).")
    return BenchResult("ranks", table, {"groups": groups, "deaths": deaths}, notes)


def _rank_deaths(args: argparse.Namespace, run_dir: Path, copies: str) -> dict:
    report_path = run_dir / "chaos" / "report.json"
    if not report_path.is_file():
        command = [sys.executable, "-m", "turnkeep", "chaos", "--run-dir", str(run_dir), "--config",
                   str(args.config), "--kills", str(args.kills), "--target", "rank", "--steps",
                   str(args.chaos_steps), "--seed", str(args.seed), "--max-delay-s", "10"]
        for setting in [*args.set, "train.ranks=2", f"train.save_period={args.save_period}",
                                   f"train.rank_copies={copies == 'on'}"]:
            command += ["--set", setting]
        print(f"bench ranks: {args.kills} rank kills with rank copies {copies} in {run_dir}", flush=True)
        subprocess.call(command)
    if not report_path.is_file():
        raise SystemExit(f"turnkeep bench ranks: the chaos run in {run_dir} wrote no report; see its chaos/ folder")
    return death_figures(orjson.loads(report_path.read_bytes()), _undone_steps(run_dir))


def death_figures(report: dict, undone: list[int]) -> dict:
    repairs = [r["after_kill_s"] for r in report["rounds"] if r["outcome"] == "repaired"]
    counts = report["verdict"]["counts"]
    return {"kills": len(report["rounds"]), "repaired": len(repairs), "ok": report["verdict"]["ok"] and report["ok"],
            "repair_s_median": round(statistics.median(repairs), 1) if repairs else None,
            "repair_s_max": max(repairs) if repairs else None,
            "undone_median": statistics.median(undone) if undone else 0, "undone_max": max(undone, default=0),
            "tokens_generated": counts["tokens_generated"], "tokens_regenerated": counts["tokens_regenerated"],
            "share": counts["tokens_regenerated_share"]}


def _undone_steps(run_dir: Path) -> list[int]:
    """Per restore after a rank's death: the steps it undid (the checkpoint it restored was that far behind)."""
    from turnkeep.primitives.audit_log import read_audit

    return [len(e.kept_after_cut.undone_steps) if e.kept_after_cut is not None else 0
            for e in read_audit(run_dir) if e.event == "restored" and e.inc > 1]
