"""What a chaos run reports: one `Round` per kill, the failures and warnings of the runs
themselves, and `report.json` with the invariant verdict, printed as a table."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from turnkeep.chaos.targets import NODE, REPAIRED_BY_THE_RUN
from turnkeep.chaos.verdict import Verdict


@dataclass
class Round:
    incarnation: int
    point: str
    outcome: str
    """`killed` (the run died with it), `timeout` (the point never came; killed anyway), `repaired` (the run
    started the process again and went on), `stopped` (the run stopped with a one-line reason), `hung` (it did
    neither in time), `missing` (the target was not running), `finished` or `crashed` (exited on its own)."""
    exit_code: int | None
    seconds: float
    processes_killed: int = 0
    log: str = ""
    target: str = "all"
    reason: str = ""
    """The run's one-line reason for stopping (`stopped`), or what went wrong."""
    after_kill_s: float | None = None
    """Seconds from the kill until the run stopped (`stopped`) or was training again (`repaired`)."""
    first_step_s: float | None = None
    """A fresh start: seconds from the start until its first train step (a restart's recovery included)."""
    lost: list[str] = field(default_factory=list)
    """A `node` kill: the run's processes (pid-file roles) that went with the node."""
    lost_urls: dict[str, str] = field(default_factory=dict)
    """Where those of them that served (the engines) answered, by role: on the lost node's address."""
    at_unix_s: float | None = None
    """Wall-clock time of the kill or freeze (None: none was made)."""

    @property
    def label(self) -> str:
        return f"timeout:{self.point}" if self.outcome == "timeout" else self.point


def run_failures(rounds: list[Round], final: Round | None) -> list[str]:
    """Runs that did not end the way the chaos run expects: a crash is a bug, not a kill."""
    failures = [
        f"incarnation {r.incarnation} crashed with exit code {r.exit_code} before its kill at {r.point} (log {r.log})"
        for r in rounds if r.outcome == "crashed"
    ]
    failures += [
        f"incarnation {r.incarnation}: after the {r.target} was killed at {r.point} the run neither stopped nor "
        f"repaired itself within {r.seconds:.0f}s: {r.reason} (log {r.log})"
        for r in rounds if r.outcome == "hung"
    ]
    failures += [
        f"incarnation {r.incarnation}: the run stopped after the {r.target} was killed, without a one-line reason "
        f"(exit {r.exit_code}, log {r.log})"
        for r in rounds if r.outcome == "stopped" and not r.reason
    ]
    if final is None:
        failures.append("the final run never started")
    elif final.outcome == "timeout":
        failures.append(f"the final run did not finish within {final.seconds:.0f}s and was killed (log {final.log})")
    elif final.exit_code != 0:
        failures.append(f"the final run exited with code {final.exit_code} (log {final.log})")
    return failures


def run_warnings(rounds: list[Round], kills_requested: int) -> list[str]:
    warnings = [
        f"incarnation {r.incarnation}: {r.point} not reached within {r.seconds:.0f}s; killed anyway"
        for r in rounds if r.outcome == "timeout"
    ]
    kills = sum(r.outcome in ("killed", "timeout") for r in rounds)
    if any(r.outcome == "finished" for r in rounds):
        warnings.append(f"the run finished after {kills} of {kills_requested} kills; give it more --steps")
    return warnings


def build_report(
    *, meta: dict, rounds: list[Round], final: Round | None, verdict: Verdict, snapshot_problems: list[str],
    snapshot_checks: int,
) -> dict:
    failures = run_failures(rounds, final)
    counts = verdict.counts
    return {
        **meta,
        "rounds": [{**asdict(r), "label": r.label} for r in rounds],
        "final_run": asdict(final) if final is not None else None,
        "kills_by_point": dict(sorted(Counter(r.label for r in rounds if r.outcome in KILLED).items())),
        "kills_by_target": dict(sorted(Counter(r.target for r in rounds if r.outcome in KILLED).items())),
        "outcomes_by_target": outcomes_by_target(rounds),
        "restart_to_first_step_s": restart_times(rounds, final),
        "repair_s_by_target": {target: _median([r.after_kill_s for r in rounds if r.target == target
                                                and r.outcome == "repaired"])
                               for target in REPAIRED_BY_THE_RUN if any(r.target == target for r in rounds)},
        "lost_with_node": dict(sorted(Counter(role for r in rounds if r.target == NODE for role in r.lost).items())),
        "restores_by_source": dict(sorted(counts.restores_by_source.items())),
        "snapshot_checks": snapshot_checks,
        "newest_snapshot_problems": list(snapshot_problems),
        "verdict": verdict.to_dict(),
        "median_restart_to_first_generation_s": counts.median_restart_to_first_generation_s,
        "tokens_regenerated": counts.tokens_regenerated,
        "tokens_generated": counts.tokens_generated,
        "tokens_regenerated_share": counts.tokens_regenerated_share,
        "tokens_discarded": counts.tokens_discarded,
        "warnings": run_warnings(rounds, meta.get("kills_requested", len(rounds))),
        "failures": failures,
        "ok": verdict.ok and not failures,
    }


KILLED = ("killed", "timeout", "repaired", "stopped", "hung")
"""Outcomes of a round whose target was killed."""


def outcomes_by_target(rounds: list[Round]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter] = {}
    for r in rounds:
        table.setdefault(r.target, Counter())[r.outcome] += 1
    return {target: dict(sorted(counts.items())) for target, counts in sorted(table.items())}


def restart_times(rounds: list[Round], final: Round | None) -> dict[str, float | None]:
    """Median seconds from a restart to its first train step, by what was killed before it."""
    by_cause: dict[str, list[float]] = {}
    starts = [*rounds, *([final] if final is not None else [])]
    for before, after in zip(starts, starts[1:]):
        if after.first_step_s is not None and before.outcome in ("killed", "timeout", "stopped"):
            by_cause.setdefault(before.target, []).append(after.first_step_s)
    return {target: _median(times) for target, times in sorted(by_cause.items())}


def _median(values: list[float | None]) -> float | None:
    present = sorted(v for v in values if v is not None)
    return round(present[len(present) // 2], 2) if present else None


def format_report(report: dict, verdict: Verdict) -> str:
    def listing(counts: dict) -> str:
        return ", ".join(f"{key} {n}" for key, n in counts.items()) or "none"

    final = report["final_run"]
    lines = [
        f"turnkeep chaos: {report.get('run_dir', '')} (seed {report.get('seed')})",
        f"kills by point: {listing(report['kills_by_point'])}",
        f"kills by target: {listing(report.get('kills_by_target', {}))}",
    ]
    lines += [f"  {target}: {listing(outcomes)}" for target, outcomes in report.get("outcomes_by_target", {}).items()]
    if report.get("restart_to_first_step_s"):
        lines.append("restart -> first train step (median s), by what was killed: "
                     + listing(report["restart_to_first_step_s"]))
    if any(r["target"] == NODE for r in report["rounds"]):
        lines.append("run processes lost with the node: " + listing(report.get("lost_with_node", {})))
    if report.get("repair_s_by_target"):
        lines.append("kill -> training again without a restart (median s): " + listing(report["repair_s_by_target"]))
    lines += [
        f"incarnation {r['incarnation']} {r['outcome']} on its own (exit {r['exit_code']}) before its kill at {r['point']}"
        for r in report["rounds"] if r["outcome"] in ("finished", "crashed")
    ]
    if final is not None:
        lines.append(f"final run: {final['outcome']}, exit {final['exit_code']} after {final['seconds']:.0f}s")
    lines += [
        f"newest published snapshot checked after {report['snapshot_checks']} kills: "
        f"{len(report['newest_snapshot_problems'])} broken",
        "",
        verdict.format(),  # restores by source, restart -> first generation and regenerated tokens are in it
        "",
    ]
    lines += [f"warning: {w}" for w in report["warnings"]]
    lines += [f"RUN FAILED: {f}" for f in report["failures"]]
    lines.append("chaos: PASS" if report["ok"] else "chaos: FAIL")
    return "\n".join(lines)
