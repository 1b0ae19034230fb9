"""Recovery: time from a restart to the first resumed generation, and the share of tokens
generated again, from a `turnkeep chaos` run."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import orjson

from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.chaos.invariants.figures import turns_committed_again
from turnkeep.chaos.invariants.running_agents import JOURNAL_GRACE_S
from turnkeep.primitives.audit_log import read_audit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chaos-dir", type=Path, help="a finished chaos run (default: run one in <out>/chaos)")
    parser.add_argument("--kills", type=int, default=20, help="kills of the chaos run this starts (default 20)")


def _report_path(chaos_dir: Path) -> Path:
    """The chaos run's report, which `turnkeep chaos` writes only once its last, undisturbed incarnation finished and
    the invariants were checked."""
    path = chaos_dir / "chaos" / "report.json"
    if not path.is_file():
        raise SystemExit(f"turnkeep bench recovery: {chaos_dir} has no chaos/report.json, so it is not a finished "
                         "chaos run; point --chaos-dir at a run `turnkeep chaos` finished, or leave it out to start one")
    return path


NEEDED_COUNTS = ("restart_to_first_generation_s", "restores_by_source", "median_restart_to_first_generation_s",
                 "tokens_regenerated", "tokens_generated", "tokens_regenerated_share", "continuations_restored",
                 "continuations_sealed")
"""What the table reads from the report's verdict counts (an older `turnkeep chaos` wrote fewer)."""


def _readable_report(path: Path) -> dict:
    """The report, or one line naming what it lacks and how to get a report this version reads."""
    fix = ("run `turnkeep chaos` again with this version (or leave --chaos-dir out and this command runs one)")
    try:
        report = orjson.loads(path.read_bytes())
        counts = report["verdict"]["counts"]
        report["kills_by_point"]
    except orjson.JSONDecodeError as err:
        raise SystemExit(f"turnkeep bench recovery: {path} is not JSON ({err}); {fix}") from None
    except (KeyError, TypeError) as err:
        raise SystemExit(f"turnkeep bench recovery: {path} has no {err}: not a report of `turnkeep chaos`; {fix}") \
            from None
    missing = [key for key in NEEDED_COUNTS if key not in counts]
    if missing:
        raise SystemExit(f"turnkeep bench recovery: {path} was written by an older `turnkeep chaos` (its counts lack "
                         f"{', '.join(missing)}); {fix}")
    return report


def run(args: argparse.Namespace) -> BenchResult:
    chaos_dir = args.chaos_dir
    if chaos_dir is None:
        chaos_dir = args.out / "chaos"
        command = [sys.executable, "-m", "turnkeep", "chaos", "--run-dir", str(chaos_dir), "--kills", str(args.kills)]
        for setting in args.set:
            command += ["--set", setting]
        if subprocess.call(command) == 2:  # refused before starting (its line is above): any report there is older
            raise SystemExit(f"turnkeep bench recovery: the chaos run in {chaos_dir} did not start (see the line "
                             "above); nothing was measured")
    report = _readable_report(_report_path(chaos_dir))
    verdict, counts = report["verdict"], report["verdict"]["counts"]
    restarts = [s for s in counts["restart_to_first_generation_s"].values() if s is not None]
    rows = [
        ["kills", sum(report["kills_by_point"].values())],
        ["kills by point", ", ".join(f"{k} {v}" for k, v in sorted(report["kills_by_point"].items()))],
        ["restores by source", ", ".join(f"{k} {v}" for k, v in sorted(counts["restores_by_source"].items()))],
        ["restores that continued in-flight agents", counts.get("restores_continuing_agents", "not counted")],
        [f"restores whose killed incarnation had agents to continue (a turn >= {JOURNAL_GRACE_S:g} s before the kill)",
         counts.get("restores_owing_agents", "not counted")],
        ["invariants the chaos checker runs", "all hold" if verdict["ok"] else "BROKEN"],
        ["restart -> first train step, median s (by what was killed)",
         ", ".join(f"{target} {s}" for target, s in report.get("restart_to_first_step_s", {}).items()) or "none"],
        ["restart -> first generation, median s", counts["median_restart_to_first_generation_s"]],
        ["restart -> first generation, max s", max(restarts, default=0.0)],
        ["tokens generated again", f"{counts['tokens_regenerated']} of {counts['tokens_generated']} "
                                   f"({counts['tokens_regenerated_share']:.2%})"],
        ["tokens in groups discarded whole, never trained", _discarded(counts)],
        ["saved agents continued / sealed on their saved prefix",
         f"{counts['continuations_restored']} / {counts['continuations_sealed']}"],
    ]
    notes = ["Restart to the first train step is process start-up (Ray and Temporal, the trainer, vLLM) and the "
             "restore; from there to the first generation, the steps the kill undid (trained after the newest "
             "snapshot, up to train.save_period of them) train again first, generation held meanwhile by the "
             "staleness bound. A kill's moment sets how many: docs/recovery.md, \"Where a restart's time goes\", "
             "times one pinned moment phase by phase.",
             "Tokens generated again: turns of a sibling that a later incarnation committed again (same group, "
             "sibling and turn index), read from the audit log's turns alone. A restore keeps what the journals "
             "hold after its cut (`rollout_recovery.keep_after_cut`; a fresh restart keeps the first incarnation's "
             "journal the same way), so they are the last moments before a kill that no journal held yet; a turn "
             "still being generated at a kill was never committed and is not counted.",
             "Tokens in groups discarded whole: every turn of a group the train pump threw away (`stale`: its "
             "oldest turn more than `train.max_staleness` policies behind the trainer; `too_few_siblings`) and that "
             "no step of the final lineage trained. Not generated again, but generated for nothing."]
    if ages := lost_turn_ages(list(read_audit(chaos_dir))):
        notes.append(f"Each turn generated again had been committed at most {max(ages):.2f} s (median "
                     f"{statistics.median(ages):.2f} s) before the last event of the incarnation that lost it: "
                     "what a kill takes is its last moments.")
    if "seed" in report:
        notes.append(f"Chaos run: `turnkeep chaos --kills {report.get('kills_requested')} --steps {report.get('steps')} "
                     f"--seed {report['seed']}`" + (f", random kills 0.5-{report['max_delay_s']:.0f} s after a train "
                                                    "step" if report.get("max_delay_s") else "") + ".")
    return BenchResult("recovery", markdown_table(["figure", "value"], rows),
                       {"chaos_dir": str(chaos_dir), "report": report}, notes)


def _discarded(counts: dict) -> str:
    if "tokens_discarded" not in counts:
        return "not counted (a report from before they were)"
    total = counts["tokens_generated"] or 1
    return ", ".join(f"{reason} {tokens} ({tokens / total:.1%})"
                     for reason, tokens in counts["tokens_discarded"].items()) or "none"


def lost_turn_ages(events: list) -> list[float]:
    """Seconds from each turn a later incarnation committed again (`turns_committed_again`) to the last event of
    the incarnation that committed it first."""
    last_event = {event.inc: event.t for event in events}
    lost = turns_committed_again(event for event in events if event.event == "turn_committed")
    return [last_event[turn.inc] - turn.t for turn in lost]
