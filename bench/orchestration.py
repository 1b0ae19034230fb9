"""`turnkeep bench orchestration`: what Temporal and the workflow add to each snapshot
attempt of a finished run, i.e. the attempt's wall time minus the time spent inside its
activities, read from the attempts' recorded histories."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from temporalio.client import Client, WorkflowExecutionStatus

from turnkeep.bench.attempt_history import HistoryTimes, add_local_clocks, history_times
from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import run_id_of
from turnkeep.schemas import search_attributes as sa
from turnkeep.schemas.choices import MetricsKind
from turnkeep.schemas.names import WorkflowType

ATTEMPT_TYPE = WorkflowType.SNAPSHOT_ATTEMPT


@dataclass
class AttemptCost:
    workflow_id: str
    trigger: str | None
    outcome: str
    """The attempt's TurnkeepOutcome; the close event's kind where it never set one."""
    started: datetime | None
    times: HistoryTimes

    @property
    def orchestration_s(self) -> float:
        return self.times.wall_s - self.times.inside_s

    @property
    def per_activity_s(self) -> float | None:
        return self.orchestration_s / self.times.activities if self.times.activities else None

    def as_dict(self) -> dict[str, Any]:
        return {"workflow_id": self.workflow_id, "trigger": self.trigger, "outcome": self.outcome,
                "started": self.started.isoformat() if self.started else None, **asdict(self.times),
                "orchestration_s": self.orchestration_s, "orchestration_per_activity_s": self.per_activity_s}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=Path, action="append", default=None,
                        help="a finished `turnkeep run` directory (its temporal.db is copied, never opened in place; "
                             "default: <out>/overhead/on); repeat it to pool the attempts of several runs")
    parser.add_argument("--limit", type=int, default=None, help="only the newest N closed attempts")


def run(args: argparse.Namespace) -> BenchResult:
    run_dirs = [Path(d) for d in args.run_dir] if args.run_dir else [args.out / "overhead" / "on"]
    costs = [cost for run_dir in run_dirs for cost in asyncio.run(costs_of_run_dir(run_dir, args.limit))]
    return result_of(costs)


async def attempt_costs(client: Client, run_id: str, workflow_type: str = ATTEMPT_TYPE,
                        limit: int | None = None, local_clocks: dict | None = None) -> list[AttemptCost]:
    """Every closed attempt of the run (the newest `limit` of them), oldest first; `local_clocks`
    ((workflow id, run id) -> `local_activity` lines) counts local activities by their own clocks."""
    costs = []
    async for wf in client.list_workflows(f"{sa.RUN_ID.name} = '{run_id}' AND WorkflowType = '{workflow_type}'"):
        if wf.status in (None, WorkflowExecutionStatus.RUNNING):
            continue
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        times = history_times(history.events)
        add_local_clocks(times, (local_clocks or {}).get((wf.id, wf.run_id), []))
        outcome = wf.typed_search_attributes.get(sa.OUTCOME)
        costs.append(AttemptCost(
            workflow_id=wf.id, trigger=wf.typed_search_attributes.get(sa.TRIGGER),
            # An attempt that failed or was cancelled before its last line still says "running".
            outcome=outcome if outcome and outcome != "running" else times.close,
            started=wf.start_time, times=times,
        ))
        if limit is not None and len(costs) >= limit:
            break
    return sorted(costs, key=lambda cost: cost.started.timestamp() if cost.started else 0.0)


async def costs_of_run_dir(run_dir: Path, limit: int | None,
                           workflow_type: str = ATTEMPT_TYPE) -> list[AttemptCost]:
    from turnkeep.primitives.temporal_client import connect
    from turnkeep.schemas.config_services import TemporalConfig
    from turnkeep.workers.temporal.dev_server import start_dev_server, stop_dev_server

    run_id = run_id_of(run_dir)
    temporal = orjson.loads((run_dir / "config.json").read_bytes()).get("temporal", {})
    clocks = local_clocks_of(run_dir)
    namespace = temporal.get("namespace", "default")
    if not (run_dir / "temporal.db").exists():
        if not temporal.get("address"):
            raise SystemExit(f"turnkeep bench orchestration: {run_dir} has no temporal.db and its config names no "
                             "Temporal address; pass a run that used the embedded dev server or an external one")
        return await attempt_costs(await connect(temporal["address"], namespace), run_id, workflow_type, limit,
                                   clocks)

    # A server on the run's own database would fire the timers and timeouts of anything left
    # open and so change the run a restart recovers from: read a copy instead.
    with tempfile.TemporaryDirectory(prefix="tk-orch-") as scratch:
        for part in run_dir.glob("temporal.db*"):  # the database and its -wal/-shm, if any
            shutil.copy2(part, Path(scratch) / part.name)
        endpoint = None
        try:
            endpoint = await start_dev_server(TemporalConfig(port=0, ui_port=0, namespace=namespace), Path(scratch))
            return await attempt_costs(await connect(endpoint.address, namespace), run_id, workflow_type, limit,
                                       clocks)
        finally:
            stop_dev_server(endpoint)


def local_clocks_of(run_dir: Path) -> dict[tuple[str, str], list[dict]]:
    """The controller's `local_activity` lines in metrics.jsonl, by (workflow id, workflow run id)."""
    from turnkeep.primitives.atomic_files import read_jsonl

    clocks: dict[tuple[str, str], list[dict]] = {}
    path = run_dir / "metrics.jsonl"
    for line in read_jsonl(path) if path.exists() else []:
        if line.get("kind") == MetricsKind.LOCAL_ACTIVITY:
            clocks.setdefault((line["workflow_id"], line["workflow_run_id"]), []).append(line)
    return clocks


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (q in 0..100)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def result_of(costs: list[AttemptCost]) -> BenchResult:
    columns = {
        "wall": [c.times.wall_s for c in costs],
        "inside activities": [c.times.inside_s for c in costs],
        "orchestration (wall - inside)": [c.orchestration_s for c in costs],
        "orchestration per activity": [c.per_activity_s for c in costs if c.per_activity_s is not None],
        "queue (schedule -> start)": [c.times.queue_s for c in costs],
        "workflow tasks (schedule -> complete)": [c.times.workflow_task_s for c in costs],
        "workflow tasks: waiting for a worker": [c.times.workflow_task_wait_s for c in costs],
        "local activities: hop to the controller's loop": [c.times.local_hop_s for c in costs
                                                           if c.times.local_clocked],
        "retries (earlier attempts + backoff)": [c.times.retry_s for c in costs],
    }
    rows = [[name, len(values), *(1000 * percentile(values, q) for q in (50, 90, 100))]
            for name, values in columns.items() if values]
    table = markdown_table(["per attempt", "n", "median ms", "p90 ms", "max ms"], rows)
    summary = {name: {"median_s": percentile(v, 50), "p90_s": percentile(v, 90), "max_s": max(v), "n": len(v)}
               for name, v in columns.items() if v}
    outcomes: dict[str, int] = {}
    for cost in costs:
        outcomes[cost.outcome] = outcomes.get(cost.outcome, 0) + 1
    return BenchResult(
        name="orchestration", table=table, notes=notes_of(costs),
        data={"attempts": [c.as_dict() for c in costs], "summary": summary, "outcomes": outcomes},
    )


def notes_of(costs: list[AttemptCost]) -> list[str]:
    if not costs:
        return ["no closed snapshot attempts found for this run"]

    def total(of) -> float:
        return sum(of(c) for c in costs)

    wall, orchestration = total(lambda c: c.times.wall_s), total(lambda c: c.orchestration_s)
    activities, tasks = total(lambda c: c.times.activities), total(lambda c: c.times.workflow_tasks)
    task_s, task_wait_s = total(lambda c: c.times.workflow_task_s), total(lambda c: c.times.workflow_task_wait_s)
    parts = {
        "workflow tasks (scheduled -> completed)": task_s,
        "activity dispatch to a worker (queue)": total(lambda c: c.times.queue_s),
        "local activities' hops to the controller's loop and back": total(lambda c: c.times.local_hop_s),
        "retried activities' earlier attempts and backoff": total(lambda c: c.times.retry_s),
    }
    # Between events the workflow neither runs nor waits on a task queue (a child's start before its first task).
    parts["gaps between events"] = orchestration - sum(parts.values())
    ranked = sorted(parts.items(), key=lambda item: -item[1])
    notes = [
        f"{len(costs)} attempts, {activities:.0f} activities: orchestration (wall - inside) is "
        f"{_percent(orchestration, wall)} of attempt wall time, {1000 * orchestration / max(activities, 1):.0f} ms "
        "per activity",
        "where it goes: " + "; ".join(f"{name} {1000 * value:.0f} ms ({_percent(value, orchestration)})"
                                      for name, value in ranked if value > 0),
    ]
    if tasks:
        notes.append(
            f"per workflow task ({tasks:.0f} in all: one to start, one after each activity that is not local; "
            f"{total(lambda c: c.times.local_activities):.0f} local activities ran inside them): "
            f"{1000 * task_wait_s / tasks:.0f} ms "
            f"before the worker took it and {1000 * (task_s - task_wait_s) / tasks:.0f} ms until it completed "
            "(local activities' own time taken out); the workflow code itself is a few lines, so that is the SDK's "
            "work (each local activity is a round trip through it, a few ms of CPU) and a worker process (its event "
            "loop, the GIL or the CPU) that was busy"
        )
    unclocked = sum(1 for c in costs if c.times.local_activities and not c.times.local_clocked)
    if unclocked:
        notes.append(f"{unclocked} attempts' local activities counted by their markers, whose stamps are not one "
                     "clock under load (no `local_activity` lines in metrics.jsonl: a run from before they were "
                     "recorded)")
    slowest = max(costs, key=lambda c: c.orchestration_s)
    notes.append(f"slowest orchestration: {slowest.workflow_id} ({slowest.outcome}), "
                 f"{1000 * slowest.orchestration_s:.0f} ms over {slowest.times.activities} activities")
    return notes


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"
