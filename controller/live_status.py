"""`<run_dir>/status.json`: what the running controller sees now, for `turnkeep status`.

Rewritten every `EVERY_S` with the step, the policy version and every holder of every
gate: the controller's admission gate and deadline clocks, the trainer's hold and the
policy server's admission gate (the last two as `controller.remote_holds` sampled
them). A reader tells a live file from a stale one by its time and by whether the
controller in `pids/controller.json` still runs.
"""

from __future__ import annotations

import time
from pathlib import Path

from turnkeep.primitives.atomic_files import atomic_write_json

LIVE_STATUS_FILE = "status.json"
EVERY_S = 2.0


def live_status(controller, remote_holders: dict[str, list[str]], incarnation: int) -> dict:
    training = controller.training
    return {
        "t": round(time.time(), 3),
        "incarnation": incarnation,
        "step": training.step,
        "policy_version": training.policy_version,
        "holders": {
            "admission": sorted(controller.admission.holders()),
            "deadlines": sorted(controller.deadline_holds.holders()),
            **{name: sorted(holders) for name, holders in remote_holders.items()},
        },
        "engines": [{"engine": e.index, "state": str(e.state), "url": e.url, "version": e.version,
                     "restarts": e.restarts} for e in controller.processes.engines.all()],
        "outstanding_groups": len(controller.ledger.group_ids()),
        "rows_waiting": controller.data_plane.num_rows(),
    }


def write_live_status(run_dir: Path, status: dict) -> None:
    atomic_write_json(Path(run_dir) / LIVE_STATUS_FILE, status)
