"""`turnkeep scale --run-dir D --engines N`: add or remove policy engines while the run goes on.

It sends the run workflow's `set_engines` update through Temporal (the same call an operator can make with
`temporal workflow update execute --name set_engines`), so the change is validated, recorded in the run's history
and carried out between snapshot attempts; a bad count is refused with the reason. Engines 0..N-1 are kept: added
ones are started and refitted before they take turns, removed ones finish their calls and stop. The count is kept
for the run's next start (`controller/engines/scaled_count.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError

from turnkeep.cli.status_files import NotARunDir, gather
from turnkeep.cli.status_temporal import run_security
from turnkeep.primitives.temporal_client import connect
from turnkeep.schemas.names import run_workflow_id
from turnkeep.schemas.snapshot import MAX_ENGINES, SetEnginesInput, SetEnginesResult

CONNECT_S = 10.0


def add_scale_parser(subparsers) -> argparse.ArgumentParser:
    scale = subparsers.add_parser("scale", help="add or remove policy engines while the run goes on")
    scale.add_argument("--run-dir", type=Path, required=True, help="the run directory of a running `turnkeep run`")
    scale.add_argument("--engines", type=int, required=True, help=f"policy engines to have (1 to {MAX_ENGINES})")
    return scale


def run_scale(args: argparse.Namespace) -> int:
    try:
        report = gather(args.run_dir)
    except NotARunDir as err:
        return _fail(str(err))
    temporal = report["temporal"]
    if not report["up"] or temporal is None:
        return _fail(f"the run in {args.run_dir} is not running; start it (`turnkeep run --run-dir "
                     f"{args.run_dir}`) and scale it while it runs, or set policy.engines for its next start")
    try:
        result = asyncio.run(_scale(Path(args.run_dir), report["run_id"], temporal["address"],
                                    temporal["namespace"] or "default", args.engines))
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        return _fail(f"scaling to {args.engines} engines was refused: {getattr(cause, 'message', None) or cause}")
    except (RPCError, OSError, TimeoutError) as err:
        return _fail(f"could not reach the run workflow at {temporal['address']}: {err}")
    print(f"turnkeep: {len(result.engines)} policy engines ({_change(result)}; {result.seconds:.1f}s)", flush=True)
    return 0


async def _scale(run_dir: Path, run_id: str, address: str, namespace: str, engines: int) -> SetEnginesResult:
    client = await asyncio.wait_for(connect(address, namespace, run_security(run_dir)), CONNECT_S)
    handle = client.get_workflow_handle(run_workflow_id(run_id))
    # A count below 1 or above the limit reaches the workflow's validator, which refuses it with the reason.
    return await handle.execute_update("set_engines", SetEnginesInput(engines=list(range(max(engines, 0)))),
                                       result_type=SetEnginesResult)


def _change(result: SetEnginesResult) -> str:
    parts = [f"started {result.started}" if result.started else "", f"retired {result.retired}" if result.retired
             else ""]
    return ", ".join(p for p in parts if p) or "unchanged"


def _fail(message: str) -> int:
    print(f"turnkeep: {message}", file=sys.stderr, flush=True)
    return 2
