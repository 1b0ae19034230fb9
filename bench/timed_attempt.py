"""One snapshot attempt's phases, each timed: prepare, commit, cut, publish.

The phases are the attempt's own functions, minus Temporal and HTTP: the Gym phase's
`prepare_participants` and `commit_participants` drive the environment participant's
core in this process, the cut is `cut_under_barrier` (what `data_plane.cut` runs under
the barrier), and publish is `publish_snapshot`. Left out: closing admission, the
trainer hold, the policy participant, and the cut's one HTTP call to the environment
server (its progress marker), none of which grows with A or R.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from turnkeep.bench.filled_controller import STEP, FilledController
from turnkeep.bench.gc_clock import GcClock
from turnkeep.bench.parked_gym import ParkedGym
from turnkeep.controller.snapshot.cut import cut_under_barrier
from turnkeep.controller.snapshot.env_server_phase import commit_participants, prepare_participants
from turnkeep.controller.snapshot.publish import publish_snapshot
from turnkeep.controller.state.continuations import read_saved_agents
from turnkeep.controller.stores import snapshot_store
from turnkeep.participants.in_process import InProcessParticipant
from turnkeep.schemas.attempt_steps import TrainerHoldResult
from turnkeep.schemas.names import checkpoint_id as attempt_id

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


async def _no_other_leases() -> None:
    """Nothing else is held here (no admission gate, no trainer)."""


async def timed_attempt(gym: ParkedGym, controller: FilledController, run_dir: Path, number: int) -> AttemptTimes:
    checkpoint_id = attempt_id(RUN_ID, STEP, number)
    env = InProcessParticipant(gym.core)
    staging = snapshot_store.open_staging(run_dir, STEP, number)
    hold = TrainerHoldResult(step=controller.training.step, policy_version=controller.training.policy_version)
    gc_at: dict[str, float] = {}
    try:
        with GcClock() as gc_clock:
            started = time.perf_counter()
            await prepare_participants([env], checkpoint_id, LEASE_S, _no_other_leases)
            prepared, gc_at["prepare"] = time.perf_counter(), gc_clock.seconds
            committed = await commit_participants([env], checkpoint_id, staging)
            commit_done, gc_at["commit"] = time.perf_counter(), gc_clock.seconds
            saved_agents = read_saved_agents(staging)
            gc_before = gc_clock.seconds
            cut = await cut_under_barrier(controller, staging, saved_agents, STEP, hold)
            barrier_s, gc_at["barrier"] = cut.barrier_s, gc_clock.seconds - gc_before
            cut_done, gc_at["cut"] = time.perf_counter(), gc_clock.seconds
            published = publish_snapshot(
                staging, run_id=RUN_ID, checkpoint_id=checkpoint_id, anchor_step=STEP, number=number,
                policy_version=cut.policy_version, fingerprint=FINGERPRINT,
                artifacts=[*committed.artifacts, cut.artifact], counts={**committed.counts, **cut.counts()},
                keep_latest_k=KEEP_LATEST_K,
            )
            publish_done, gc_at["publish"] = time.perf_counter(), gc_clock.seconds
    finally:
        # Resume after publish as the attempt does, or abort-like cleanup after a failure.
        await env.resume(checkpoint_id)
        shutil.rmtree(staging, ignore_errors=True)  # gone already once published
    return AttemptTimes(
        prepare_s=prepared - started, commit_s=commit_done - prepared, cut_s=cut_done - commit_done,
        barrier_s=barrier_s, publish_s=publish_done - cut_done, bytes_written=published.bytes_written,
        snapshot_dir=str(published.snapshot_dir),
        gc_s={"prepare": gc_at["prepare"], "commit": gc_at["commit"] - gc_at["prepare"],
              "cut": gc_at["cut"] - gc_at["commit"], "barrier": gc_at["barrier"],
              "publish": gc_at["publish"] - gc_at["cut"]},
    )
