"""Hangs: one process of a run SIGSTOPped at a time (`turnkeep chaos --target freeze-*`), and what the run made
of it: seconds from the freeze to the probe that caught it (its `hang` line), to its replacement and to the next
train step, and the train steps the repair undid (trained again after it)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import orjson

from turnkeep.bench.report import BenchResult, markdown_table

TARGETS = ("freeze-engine", "freeze-env", "freeze-temporal", "freeze-rank", "freeze-controller")
HANG_SETTINGS = ("train.ranks=2", "policy.hang_s=20", "train.hang_s=20", "temporal.hang_s=10",
                 "ray.controller_hang_s=20", "train.save_period=5")
"""Short windows, so each freeze is noticed within seconds (the defaults are sized for real models: 60, 300, 30,
120 s); two ranks, so a rank can freeze."""
HANG_TARGET = {"freeze-engine": "engine", "freeze-env": "env", "freeze-temporal": "temporal",
               "freeze-rank": "trainer ranks", "freeze-controller": "controller"}
"""How each freeze's `hang` line names what it killed (an engine's: `engine <k>`)."""
REPAIR_KIND = {"freeze-engine": "engine_restart", "freeze-env": "env_restart", "freeze-temporal": "temporal_restart",
               "freeze-rank": "trainer_rebuild", "freeze-controller": "startup"}
"""The metrics line that marks each one's replacement (the controller's: the next incarnation's start)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chaos-dir", type=Path, help="a finished chaos run with freeze targets (default: run one "
                                                       "in <out>/hangs)")
    parser.add_argument("--rounds", type=int, default=1, help="freezes of each target (default 1)")
    parser.add_argument("--steps", type=int, default=300,
                        help="train steps of the chaos run (default 300: room for every freeze before the end)")
    parser.add_argument("--seed", type=int, default=49, help="the chaos run's schedule (default 49)")


def run(args: argparse.Namespace) -> BenchResult:
    chaos_dir = args.chaos_dir or args.out / "hangs"
    if args.chaos_dir is None:
        command = [sys.executable, "-m", "turnkeep", "chaos", "--run-dir", str(chaos_dir), "--target",
                   ",".join(TARGETS), "--kills", str(args.rounds * len(TARGETS)), "--steps", str(args.steps),
                   "--seed", str(args.seed)]
        for setting in [*HANG_SETTINGS, *args.set]:
            command += ["--set", setting]
        print(f"bench hangs: {' '.join(command[2:])}", flush=True)
        subprocess.call(command)
    report_path = chaos_dir / "chaos" / "report.json"
    if not report_path.is_file():
        raise SystemExit(f"turnkeep bench hangs: {chaos_dir} has no chaos/report.json (the chaos run did not finish); "
                         "see its chaos/ folder and the output above")
    report = orjson.loads(report_path.read_bytes())
    lines = [orjson.loads(line) for line in (chaos_dir / "metrics.jsonl").read_bytes().splitlines() if line.strip()]
    figures = [freeze_figures(r, lines) for r in report["rounds"] if r["target"] in TARGETS and r.get("at_unix_s")]
    rows = [[f["target"], f["outcome"], f["probe"], f["noticed_s"], f["replaced_s"], f["trained_again_s"],
             f["steps_undone"]] for f in figures]
    table = markdown_table(["frozen", "outcome", "caught by", "noticed after s", "replaced after s",
                            "next train step after s", "steps undone"], rows)
    notes = [f"One `turnkeep chaos` run with {', '.join(f'`{s}`' for s in HANG_SETTINGS)}: each target SIGSTOPped "
             "once at a random moment after a train step, never continued; the run must find it, kill it by pid and "
             "replace it (a frozen controller: the run's Ray keeper kills it and the next start re-attaches).",
             "Seconds from the freeze: to the `hang` line of metrics.jsonl (the probe's verdict), to the replacement's "
             "line (`engine_restart`, `env_restart`, `temporal_restart`, `trainer_rebuild`, the next incarnation's "
             "`startup`) and to the first train step after it. Steps undone: train steps before the repair that "
             "trained again after it (a rank's repair loads the ranks' copies of the step the group reached, "
             "`train.rank_copies`; a controller's keeps the trainer's steps; both when the journals reach that step).",
             f"The chaos run: {'PASS' if report.get('ok') else 'FAIL'}; its invariants: "
             f"{'all hold' if report['verdict']['ok'] else 'BROKEN'}."]
    return BenchResult("hangs", table=table, notes=notes, data={"rounds": figures, "ok": bool(report.get("ok"))})


def freeze_figures(round_: dict, lines: list[dict]) -> dict:
    """One freeze's figures from the run's metrics lines (None where the line never came)."""
    at, target = round_["at_unix_s"], round_["target"]
    hang = next((line for line in lines if line["kind"] == "hang" and _t(line) >= at
                 and str(line.get("target", "")).startswith(HANG_TARGET[target])), None)
    noticed = _t(hang) if hang else None
    repair = next((line for line in lines if line["kind"] == REPAIR_KIND[target] and _t(line) >= (noticed or at)),
                  None)
    repaired = _t(repair) if repair else None
    after = repaired or noticed
    steps = [line for line in lines if line["kind"] == "train_step"]
    before = [line["step"] for line in steps if _t(line) < (after or float("inf"))]
    following = next((line for line in steps if after is not None and _t(line) > after), None)
    undone = max(0, max(before) - following["step"] + 1) if before and following else None
    return {"target": target, "outcome": round_["outcome"], "probe": hang.get("probe") if hang else None,
            "noticed_s": _since(noticed, at), "replaced_s": _since(repaired, at),
            "trained_again_s": _since(_t(following) if following else None, at), "steps_undone": undone}


def _t(line: dict) -> float:
    return float(line.get("t", line.get("unix_s", 0.0)))


def _since(t: float | None, at: float) -> float | None:
    return None if t is None else round(t - at, 1)
