"""Named moments where `turnkeep chaos` kills the whole process tree.

With `TURNKEEP_CHAOS_KILL_AT=<point>` in the environment, the first time the controller
reaches that point it writes `<run_dir>/chaos/reached` (the point and the time) and
waits `TURNKEEP_CHAOS_WAIT_S` seconds (default 30) for the chaos command to SIGKILL it
mid-phase. Without the variable, `reached` does nothing; if nobody kills the process,
it carries on after the wait.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from turnkeep.primitives.atomic_files import atomic_write_text

ENV_POINT = "TURNKEEP_CHAOS_KILL_AT"
ENV_WAIT = "TURNKEEP_CHAOS_WAIT_S"
POINTS = ("gym_prepare", "gym_commit", "cut", "publish", "resume", "restore", "checkpoint_write", "prune")
"""Points inside the code; `training` (a random moment between steps) needs no hook. `checkpoint_write` is in
the middle of a trainer checkpoint (its files written, no manifest yet, not renamed into place); `prune` is in the
middle of removing an old trainer checkpoint (renamed away, its files not deleted yet)."""
OTHER_POINTS = ("evaluation", "trained", "train_step")
"""Points tests pin a kill to that `turnkeep chaos` does not pick (a run evaluates only when its config asks):
`evaluation` holds an evaluation's journal once it has scored a few samples (`controller/pumps/eval_pump.py`);
`trained` holds the train pump after a train step past a trainer checkpoint of this incarnation, its engines
refitted (`controller/pumps/train_pump.py`): the trainer idle at the journal's step; `train_step` holds the trainer's
first train step before its computation (`gpu_workers/trainer_actor.py`): a step as slow as the wait, in flight."""

_fired: set[str] = set()


def marker_path(run_dir: Path) -> Path:
    return Path(run_dir) / "chaos" / "reached"


def _announce(point: str, run_dir: Path) -> float | None:
    if os.environ.get(ENV_POINT) != point or point in _fired:
        return None
    _fired.add(point)
    marker = marker_path(run_dir)
    marker.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(marker, f"{point} {time.time():.3f}\n")
    return float(os.environ.get(ENV_WAIT, "30"))


async def reached(point: str, run_dir: Path) -> None:
    wait_s = _announce(point, run_dir)
    if wait_s:
        await asyncio.sleep(wait_s)


def reached_sync(point: str, run_dir: Path) -> None:
    """For code that runs in a thread (publish's file work)."""
    wait_s = _announce(point, run_dir)
    if wait_s:
        time.sleep(wait_s)
