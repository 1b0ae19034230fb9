"""Replay: environments written for another ecosystem, their running rollouts continued by replay after whole-tree
kills, against the same environments declared not replayable (`options.replay = false`, so `restart_only`: every
unfinished sibling regenerated from scratch).

For each ecosystem's example (examples/verifiers_vault, examples/nemo_gym_counter, examples/openenv_guess) two chaos
runs with the same kill schedule, one per declaration, streaming their turns so the audit log counts the tokens of
turns a kill cut. Figures: tokens generated again, restart to first generation, and from the audit's
`replay_checked` lines every replay's seconds against its turns (and any replay that differed).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from turnkeep.bench.chaos_report import chaos_figures, chaos_run
from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.primitives.audit_log import read_audit
from turnkeep.schemas.audit import ReplayChecked

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ECOSYSTEMS = {
    "verifiers": (EXAMPLES / "verifiers_vault" / "config.toml", "vault"),
    "nemo_gym": (EXAMPLES / "nemo_gym_counter" / "config.toml", "counter"),
    "openenv": (EXAMPLES / "openenv_guess" / "config.toml", "guess"),
}
"""Each ecosystem's example: its config and the name of its environment there."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ecosystems", default=",".join(ECOSYSTEMS),
                        help=f"comma-separated, of {', '.join(ECOSYSTEMS)} (default: all)")
    parser.add_argument("--kills", type=int, default=6, help="random whole-tree kills of each chaos run (default 6)")
    parser.add_argument("--steps", type=int, default=40, help="train steps of each chaos run (default 40)")
    parser.add_argument("--max-delay-s", type=float, default=10.0,
                        help="kills land 0.5 s to this long after a train step (default 10)")
    parser.add_argument("--seed", type=int, default=48, help="the chaos runs' kill schedule (default 48)")
    parser.add_argument("--tool-delay-s", type=float, default=0.5,
                        help="each live step waits this long first (default 0.5), as real tools take time: the kills "
                             "then find agents mid-rollout, past a journaled turn")
    parser.add_argument("--save-period", type=int, default=2,
                        help="train.save_period of the runs (default 2): each restart has a snapshot to restore")


def run(args: argparse.Namespace) -> BenchResult:
    base = args.out / "replay"
    rows, data = [], {}
    for ecosystem in _chosen(args.ecosystems):
        config, env = ECOSYSTEMS[ecosystem]
        for replay in (True, False):
            run_dir = base / f"{ecosystem}-{'replay' if replay else 'restart_only'}"
            report = chaos_run("replay", run_dir, config, _chaos_args(args), [
                *args.set, f"environments.{env}.options.replay={str(replay).lower()}", "env.stream_turns=true",
                f"train.save_period={args.save_period}", "env.fault_injection=true",
                f'env.startup_faults={{"tool_delay_s": {{"{env}": {args.tool_delay_s}}}}}'])
            figures = {**chaos_figures(report), **replay_figures(run_dir)}
            data[f"{ecosystem} replay={replay}"] = figures
            rows.append([ecosystem, "replay" if replay else "restart_only", *_row(figures)])
    table = markdown_table(["ecosystem", "declared", "kills", "invariants", "tokens generated again (share)",
                            "per kill", "restart -> first generation, median s", "continued by replay (differed)",
                            "replay s per rollout, median (max)", "turns replayed, median", "ms per turn, median"],
                           rows)
    notes = [
        "Each pair of chaos runs has the same kill schedule (`--seed`): whole-tree SIGKILLs at random moments, each "
        "run restarted by the same command. `replay`: the environment's unfinished siblings continue from their "
        "journaled turn after a replay on a fresh instance made with the sibling's seed; `restart_only` "
        "(`options.replay = false`): they are regenerated from scratch.",
        f"Each live step waits {args.tool_delay_s} s first (the fault plan's `tool_delay_s`), as real tools take "
        "time: with the tiny model's instant turns, kills would otherwise find almost every agent between rollouts. "
        "A replay's steps do not wait: its seconds are the environment's own.",
        "Tokens generated again: turns a later incarnation committed again, plus the tokens of turns a kill cut "
        "that no continuation kept (the engines' own count), as a share of every token the engines generated.",
        "Replay seconds: the `replay_checked` lines of the audit log, one per continued rollout: making the fresh "
        "instance's episode (its reset) and stepping its journaled turns again.",
    ]
    return BenchResult("replay", table, data, notes)


def replay_figures(run_dir: Path) -> dict:
    """What the audit's `replay_checked` lines say of a run's replays."""
    checked = [e for e in read_audit(run_dir) if isinstance(e, ReplayChecked)]
    matched = [e for e in checked if not e.reason]
    seconds = [e.seconds for e in matched]
    per_turn = [e.seconds / e.turns * 1000 for e in matched if e.turns]
    return {"replays": len(checked), "replays_matched": len(matched), "replays_differed": len(checked) - len(matched),
            "replay_s_median": round(statistics.median(seconds), 4) if seconds else None,
            "replay_s_max": round(max(seconds), 4) if seconds else None,
            "replay_turns_median": statistics.median([e.turns for e in matched]) if matched else None,
            "replay_ms_per_turn_median": round(statistics.median(per_turn), 2) if per_turn else None}


def _row(f: dict) -> list:
    shown = (f"{f['replay_s_median']} ({f['replay_s_max']})" if f["replay_s_median"] is not None else "-")
    return [f["kills"], "all hold" if f["ok"] else "BROKEN",
            f"{f['tokens_regenerated']} of {f['tokens_generated']} ({f['share']:.3%})", f["per_kill"],
            f["restart_median_s"], f"{f['replays_matched']} ({f['replays_differed']})", shown,
            f["replay_turns_median"] if f["replay_turns_median"] is not None else "-",
            f["replay_ms_per_turn_median"] if f["replay_ms_per_turn_median"] is not None else "-"]


def _chaos_args(args: argparse.Namespace) -> list[str]:
    return ["--kills", str(args.kills), "--steps", str(args.steps), "--seed", str(args.seed),
            "--max-delay-s", str(args.max_delay_s)]


def _chosen(names: str) -> list[str]:
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(ECOSYSTEMS))
    if unknown:
        raise SystemExit(f"turnkeep bench replay: unknown ecosystem(s) {unknown}; use some of {list(ECOSYSTEMS)}")
    return chosen
