"""How often a run takes a snapshot attempt between trainer checkpoints: `snapshot.attempt_interval_s`
resolved against how the run's snapshots keep the running agents.

Every trainer checkpoint is a snapshot whatever the interval. With parked agents a snapshot is the only
place an in-flight agent is kept, so attempts also come every `PARKED_INTERVAL_S` by default. With
journaled agents the environment servers' turn journals and the controller journal keep everything after
the newest snapshot, and a restore keeps it (`rollout_recovery.keep_after_cut`): a periodic attempt between
checkpoints saves no turn, and each one would only add a trainer checkpoint (`checkpoint_on_demand`). By
default such a run therefore takes attempts at its checkpoints only (every `train.save_period` steps), at
preemption and when an operator asks; setting the interval brings periodic attempts back.
"""

from __future__ import annotations

from turnkeep.schemas.choices import AgentsMode

PARKED_INTERVAL_S = 20.0


def periodic_interval_s(configured: float | None, agents: AgentsMode) -> float | None:
    """Seconds between periodic attempts, or None for attempts at trainer checkpoints (and on request) only."""
    if configured is not None:
        return configured
    return PARKED_INTERVAL_S if agents == AgentsMode.PARKED else None
