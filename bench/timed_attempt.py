"""One snapshot attempt's phases as plain code, each timed: prepare, commit, cut, publish.

The phases call what the attempt's activities call, minus Temporal and HTTP: the
environment participant's core for prepare and commit, the controller's cut as
`SnapshotActivities.cut` performs it, and `snapshot_store.publish`. Left out: closing
admission, the trainer hold, the policy participant, and the cut's one HTTP call to
the environment server (its progress marker), none of which grows with A or R.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from controller.state.continuations import read_saved_agents
from controller.state.cut_state import write_cut_state
from bench.filled_controller import STEP, FilledController
from bench.gc_clock import GcClock
from bench.parked_gym import ParkedGym
from bench.synthetic_rollouts import POLICY_VERSION
from controller.stores import snapshot_store
from participants.core import ParticipantCore

RUN_ID = "bench-scaling"
FINGERPRINT = "bench-scaling"
"""Config fingerprint written into every manifest (a restore would compare it)."""
LEASE_S = 30.0
"""`snapshot.lease_s`'s default."""
KEEP_LATEST_K = 2


@dataclass(frozen=True)
class AttemptTimes:
    prepare_s: float
    commit_s: float
    cut_s: float
    """Reading the saved agents back plus the whole barrier."""
    barrier_s: float
    """Time under the data-plane barrier: no row is stored and no receipt ACKed meanwhile."""
    publish_s: float
    """Digesting every file, fsync, manifest, rename and prune."""
    gc_s: dict[str, float]
    """Of each phase's seconds (and the barrier's), how many the cyclic garbage collector took."""
    bytes_written: int
    snapshot_dir: str


async def timed_attempt(gym: ParkedGym, controller: FilledController, run_dir: Path, number: int) -> AttemptTimes:
    checkpoint_id = f"{RUN_ID}.snapshot.{STEP}.{number}"
    staging = snapshot_store.open_staging(run_dir, STEP, number)
    gc_at: dict[str, float] = {}
    try:
        with GcClock() as gc_clock:
            started = time.perf_counter()
            await _prepare(gym.core, checkpoint_id)
            prepared, gc_at["prepare"] = time.perf_counter(), gc_clock.seconds
            committed = await gym.core.commit(checkpoint_id, staging / gym.core.name)
            commit_done, gc_at["commit"] = time.perf_counter(), gc_clock.seconds
            cut_counts, barrier_s, gc_at["barrier"] = await _cut(staging, controller, gc_clock)
            cut_done, gc_at["cut"] = time.perf_counter(), gc_clock.seconds
            final, size = _publish(staging, checkpoint_id, number, {**committed.counts, **cut_counts})
            published, gc_at["publish"] = time.perf_counter(), gc_clock.seconds
    finally:
        # Resume after publish as the attempt does, or abort-like cleanup after a failure.
        gym.core.resume(checkpoint_id)
        shutil.rmtree(staging, ignore_errors=True)  # gone already once published
    return AttemptTimes(
        prepare_s=prepared - started, commit_s=commit_done - prepared, cut_s=cut_done - commit_done,
        barrier_s=barrier_s, publish_s=published - cut_done, bytes_written=size, snapshot_dir=str(final),
        gc_s={"prepare": gc_at["prepare"], "commit": gc_at["commit"] - gc_at["prepare"],
              "cut": gc_at["cut"] - gc_at["commit"], "barrier": gc_at["barrier"],
              "publish": gc_at["publish"] - gc_at["cut"]},
    )


async def _prepare(core: ParticipantCore, checkpoint_id: str) -> None:
    """prepare, then poll status until ready, as `gym.prepare` does (here the agents are parked already)."""
    give_up = time.monotonic() + LEASE_S
    status = core.prepare(checkpoint_id, LEASE_S)
    while not status.ready:
        if time.monotonic() > give_up:
            raise TimeoutError(f"participant never became ready: {status.detail}")
        await asyncio.sleep(0)
        status = core.status(checkpoint_id)


async def _cut(staging: Path, controller: FilledController, gc_clock: GcClock) -> tuple[dict[str, int], float, float]:
    """`SnapshotActivities.cut` without Temporal; returns the manifest counts, and the seconds under the
    barrier and how many of them the garbage collector took."""
    saved_agents = read_saved_agents(staging)
    entered, gc_before = time.perf_counter(), gc_clock.seconds
    async with controller.data_plane.barrier:
        state = write_cut_state(controller, saved_agents, staging / "controller" / "state.json")
        continuations = state["continuations"]
    barrier_s, barrier_gc_s = time.perf_counter() - entered, gc_clock.seconds - gc_before
    counts = {
        "data_plane_rows": len(state["data_plane"]["rows"]),
        "unfinished_groups": len(state["group_ledger"]["groups"]),
        "continuations": len(continuations),
    }
    return counts, barrier_s, barrier_gc_s


def _publish(staging: Path, checkpoint_id: str, number: int, counts: dict[str, int]) -> tuple[Path, int]:
    artifacts = [snapshot_store.artifact_for(staging, path) for path in sorted(staging.rglob("*")) if path.is_file()]
    manifest = snapshot_store.new_manifest(
        run_id=RUN_ID, checkpoint_id=checkpoint_id, anchor_step=STEP, number=number, policy_version=POLICY_VERSION,
        config_fingerprint=FINGERPRINT, artifacts=artifacts, counts=counts,
    )
    final, size, _pruned = snapshot_store.publish(staging, manifest, KEEP_LATEST_K)
    return final, size
