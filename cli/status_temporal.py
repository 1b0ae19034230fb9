"""What Temporal knows about a live run, for `turnkeep status`: the run workflow's `status`
query (paused, failures in a row, the attempt running and its phase, attempts by outcome) and
the attempts still open. Nothing here signals or changes anything."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from temporalio.client import Client

from turnkeep.primitives.temporal_client import connect
from turnkeep.schemas.config_services import TemporalConfig
from turnkeep.schemas.names import WorkflowType, run_workflow_id
from turnkeep.schemas.snapshot import RunStatus

ANSWER_S = 5.0


async def temporal_view(run_dir: Path, run_id: str, address: str, namespace: str) -> dict:
    """{"answered": False, "why": ...} when Temporal or the run workflow does not answer in time."""
    asking = f"the server at {address}"
    try:
        client = await asyncio.wait_for(connect(address, namespace, run_security(run_dir)), ANSWER_S)
        asking = f"the run workflow {run_workflow_id(run_id)} (its controller may be starting or stopping)"
        status = await asyncio.wait_for(
            client.get_workflow_handle(run_workflow_id(run_id)).query("status", result_type=RunStatus), ANSWER_S)
        asking = "the list of open attempts"
        attempts = await asyncio.wait_for(_open_attempts(client, run_id), ANSWER_S)
    except Exception as err:  # any failure to ask is reported as such, never raised at the operator
        reason = (str(err).splitlines() or [""])[0][:200] or f"no answer within {ANSWER_S:.0f} s"
        return {"answered": False, "why": f"{asking}: {reason}"}
    return {"answered": True, "paused": status.paused, "consecutive_failures": status.consecutive_failures,
            "attempts_by_outcome": status.attempts_by_outcome, "running_attempt": status.running_attempt,
            "release_pending": status.release_pending, "open_attempts": attempts}


async def _open_attempts(client: Client, run_id: str) -> list[dict]:
    query = (f'TurnkeepRunId = "{run_id}" AND WorkflowType = "{WorkflowType.SNAPSHOT_ATTEMPT}" '
             'AND ExecutionStatus = "Running"')
    found = []
    async for execution in client.list_workflows(query):
        phase = None
        try:
            phase = await client.get_workflow_handle(execution.id).query("phase", result_type=str)
        except Exception:  # it may close between the list and the query
            pass
        found.append({"id": execution.id, "phase": phase, "started": execution.start_time.isoformat()})
    return found


def run_security(run_dir: Path):
    """The run's TLS / API key settings, from the config it was started with (the embedded server needs none)."""
    try:
        config = orjson.loads((run_dir / "config.json").read_bytes())
        return TemporalConfig.model_validate(config.get("temporal") or {}).security()
    except (OSError, ValueError):
        return None
