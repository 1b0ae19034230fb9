"""Temporal history sizes of a soak run: the first and last ten attempts' event counts and the run
workflow's current history, read from the run's own Temporal server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from turnkeep.bench.runs import run_id_of
from turnkeep.primitives.temporal_client import connect
from turnkeep.schemas.names import WorkflowType, run_workflow_id


def history_lengths(run_dir: Path) -> dict:
    run_id = run_id_of(run_dir)
    record = orjson.loads((run_dir / "pids" / "temporal.json").read_bytes())
    return asyncio.run(_lengths(record["address"], record.get("namespace") or "default", run_id))


async def _lengths(address: str, namespace: str, run_id: str) -> dict:
    client = await connect(address, namespace)
    query = f'TurnkeepRunId = "{run_id}" AND WorkflowType = "{WorkflowType.SNAPSHOT_ATTEMPT}"'
    ids = [execution.id async for execution in client.list_workflows(query)]
    ids.reverse()  # the list is newest first
    counts = [await _events(client, workflow_id) for workflow_id in ids[:10] + ids[-10:]]
    first, last = counts[:10], counts[-10:]
    run_events = await _events(client, run_workflow_id(run_id))
    return {"attempt_workflows": len(ids), "first_10_attempts_events": first, "last_10_attempts_events": last,
            "run_workflow_events_now": run_events}


async def _events(client, workflow_id: str) -> int:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return len(history.events)
