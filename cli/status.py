"""`turnkeep status RUN_DIR`: a run at a glance, live or down, without reading JSON.

From the files always (`cli.status_files`); from Temporal too when the run is up
(`cli.status_temporal`). `--json` prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import orjson

from turnkeep.cli.status_files import NotARunDir, gather
from turnkeep.cli.status_temporal import temporal_view


def add_status_parser(subparsers) -> argparse.ArgumentParser:
    status = subparsers.add_parser("status", help="a run at a glance: step, reward, snapshots, gates, Temporal")
    status.add_argument("run_dir", type=Path, help="the run directory (run.run_dir / --run-dir of `turnkeep run`)")
    status.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return status


def run_status(args: argparse.Namespace) -> int:
    try:
        report = gather(args.run_dir)
    except NotARunDir as err:
        print(f"turnkeep: {err}", file=sys.stderr)
        return 2
    temporal = report["temporal"]
    if report["up"] and temporal is not None:
        report["temporal_view"] = asyncio.run(temporal_view(
            Path(args.run_dir), report["run_id"], temporal["address"], temporal["namespace"] or "default"))
    text = orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if args.json else "\n".join(render(report))
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `turnkeep status DIR | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def render(report: dict) -> list[str]:
    up = report["up"]
    lines = [f"run {report['run_id']} (incarnation {report['incarnation']}) in {report['run_dir']}: "
             + ("UP, controller pid " + str(report["processes"]["controller"]) if up else "DOWN")]
    alive = [f"{role} {pid}" if pid else f"{role} gone" for role, pid in report["processes"].items()]
    if alive:
        lines.append("  processes: " + ", ".join(alive))
    training = report["training"]
    if training:
        lines.append(f"  step {training['step']} (policy version {training['policy_version']}), reward "
                     f"{_num(training['reward_mean'])}, rollout {_num(training['rollout_tokens_per_s'])} tok/s, "
                     f"staleness {training['staleness_max']}; metrics written {_ago(training['metrics_age_s'])}")
    else:
        lines.append("  no train step yet")
    lines += _snapshot_lines(report)
    live = report["live"]
    if live and up:
        gates = ", ".join(f"{gate} [{', '.join(holders)}]" for gate, holders in live["holders"].items())
        lines.append(f"  gate holders ({_ago(live['age_s'])}): {gates}")
        lines.append(f"  groups outstanding {live['outstanding_groups']}, rows waiting for the trainer "
                     f"{live['rows_waiting']}")
        if engines := live.get("engines"):
            lines.append(_engines_line(engines, training))
    lines += _temporal_lines(report)
    return lines


def _snapshot_lines(report: dict) -> list[str]:
    lines = []
    newest = report["newest_snapshot"]
    if newest:
        counts = newest["counts"]
        agents = (f"{counts['journaled_agents']} running agents in the turn journals" if "journaled_agents" in counts
                  else f"{counts.get('parked_agents', 0)} parked agents")
        lines.append(f"  newest snapshot: {newest['dir']}, {_ago(newest['age_s'])}: step {newest['step']}, "
                     f"{counts.get('data_plane_rows', 0)} rows, {agents}, "
                     f"{counts.get('unfinished_groups', 0)} unfinished groups")
    else:
        lines.append("  no published snapshot yet")
    attempt = report["last_attempt"]
    if attempt:
        lines.append(f"  last attempt {attempt['checkpoint_id']} ({attempt['trigger']}): {attempt['outcome']}, "
                     f"admission closed {_num(attempt['admission_closed_s'])} s: {attempt['reason']}")
    recovery = report["last_recovery"]
    if recovery:
        lines.append(f"  last restore (incarnation {recovery['incarnation']}): from {recovery['source']} "
                     f"(step {recovery['step']}): {recovery['reason']}")
    if evaluation := report.get("last_eval"):
        lines.append(_eval_line(evaluation))
    return lines


def _eval_line(line: dict) -> str:
    passes = ", ".join(f"{key} {value:.3f}" for key, value in line.items() if key.startswith("pass@"))
    failed = f", {line['samples_failed']} failed" if line.get("samples_failed") else ""
    return (f"  last evaluation: step {line['step']} ({line['trigger']}): mean reward {line['mean_reward']:.3f}, "
            f"{passes} ({line['prompts']} prompts x {line['samples']} samples{failed}, policy versions "
            f"{line['policy_version_min']}-{line['policy_version_max']})")


def _temporal_lines(report: dict) -> list[str]:
    temporal = report["temporal"]
    if temporal is None:
        return ["  Temporal: the embedded dev server, stopped with the run"]
    where = f"  Temporal {temporal['address']}" + (f", UI {temporal['ui']}" if temporal["ui"] else "")
    view = report.get("temporal_view")
    if view is None:
        return [where + (" (the run is down)" if not report["up"] else "")]
    if not view["answered"]:
        return [where, f"  Temporal did not answer: {view['why']}"]
    lines = [where, f"  snapshots {'PAUSED' if view['paused'] else 'on'}, failures in a row "
                    f"{view['consecutive_failures']}, attempts by outcome {view['attempts_by_outcome']}"
                    + (f", release pending for {view['release_pending']}" if view["release_pending"] else "")]
    for attempt in view["open_attempts"]:
        lines.append(f"  open attempt {attempt['id']}: {attempt['phase'] or 'starting'}")
    return lines


def _num(value) -> str:
    return "?" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def _ago(seconds) -> str:
    if seconds is None:
        return "at an unknown time"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _engines_line(engines: list[dict], training: dict | None) -> str:
    """`engines 2 of 2 live: 0 live v12 (310 tok/s), 1 starting (restarts 1)`."""
    rates = (training or {}).get("engine_tokens_per_s") or {}
    parts = []
    for engine in engines:
        part = f"{engine['engine']} {engine['state']} v{engine['version']}"
        if (rate := rates.get(str(engine["engine"]))) is not None:
            part += f" ({_num(rate)} tok/s)"
        if engine.get("restarts"):
            part += f" (restarts {engine['restarts']})"
        parts.append(part)
    live = sum(engine["state"] == "live" for engine in engines)
    return f"  engines {live} of {len(engines)} live: " + ", ".join(parts)
