"""`turnkeep eval --run-dir D`: ask a running run for a held-out evaluation of its current weights.

It sends the run workflow's `evaluate_now` signal (the same as `temporal workflow signal --name evaluate_now`);
the controller queues the evaluation at its current train step and plays it beside training. With `--wait` it
waits for the evaluation's line in metrics.jsonl and prints it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from temporalio.service import RPCError

from turnkeep.cli.status_files import NotARunDir, gather
from turnkeep.cli.status_temporal import run_security
from turnkeep.primitives.atomic_files import read_jsonl
from turnkeep.primitives.temporal_client import connect
from turnkeep.schemas.choices import MetricsKind
from turnkeep.schemas.eval_steps import EvaluateNowSignal
from turnkeep.schemas.names import run_workflow_id

CONNECT_S = 10.0
WAIT_POLL_S = 1.0


def ask_running_run(run_dir: Path, wait: bool = False, wait_s: float = 3600.0) -> int:
    try:
        report = gather(run_dir)
    except NotARunDir as err:
        return _fail(str(err))
    temporal = report["temporal"]
    if not report["up"] or temporal is None:
        return _fail(f"the run in {run_dir} is not running; evaluate a checkpoint with `turnkeep export --run-dir "
                     f"{run_dir} --out DIR` then `turnkeep eval --model DIR`, or set eval.every_steps for its next "
                     "start")
    seen = len(_eval_lines(run_dir))
    try:
        asyncio.run(_signal(run_dir, report["run_id"], temporal["address"], temporal["namespace"] or "default"))
    except (RPCError, OSError, TimeoutError) as err:
        return _fail(f"could not reach the run workflow at {temporal['address']}: {err}")
    print(f"turnkeep: asked the run for an evaluation of its current weights; its result is the next "
          f"\"kind\": \"eval\" line of {run_dir / 'metrics.jsonl'}", flush=True)
    if not wait:
        return 0
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        lines = [line for line in _eval_lines(run_dir)[seen:] if line.get("trigger") == "operator"]
        if lines:
            print(lines[0], flush=True)
            return 0
        time.sleep(WAIT_POLL_S)
    return _fail(f"no evaluation line after {wait_s:.0f}s; see the run's log")


async def _signal(run_dir: Path, run_id: str, address: str, namespace: str) -> None:
    client = await asyncio.wait_for(connect(address, namespace, run_security(run_dir)), CONNECT_S)
    await client.get_workflow_handle(run_workflow_id(run_id)).signal("evaluate_now", EvaluateNowSignal())


def _eval_lines(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [line for line in read_jsonl(path) if line.get("kind") == MetricsKind.EVAL] if path.exists() else []


def _fail(message: str) -> int:
    print(f"turnkeep: {message}", file=sys.stderr, flush=True)
    return 2
