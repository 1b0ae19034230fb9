"""A dead trainer is replaced and the run goes on by itself (`train.max_rebuilds`): how many rebuilds in a row,
with no train step between them, the run may still make, and the line it stops with once they are spent.

The rebuild itself is a restart inside the same `turnkeep run` process: the incarnation whose trainer died ends
without stopping its engines, environment servers, Ray or Temporal; the next one re-attaches to them, starts a new
trainer group beside them (`workers.ray_cluster.reattach`) and restores into it exactly as the same command does
after a crash.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.schemas.choices import MetricsKind


class TrainerDiedAtStart(Exception):
    """The trainer died while it was started or set up (before the incarnation could watch it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TrainerLost(Exception):
    """The incarnation ended because its trainer died, and a rebuild follows; its processes were kept."""

    def __init__(self, reason: str, steps_trained: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.steps_trained = steps_trained


@dataclass
class TrainerRebuilds:
    allowed: int
    in_a_row: int = 0
    """Rebuilds made since the last incarnation that trained a step."""

    def _next(self, steps_trained: int) -> int:
        return 1 if steps_trained else self.in_a_row + 1

    def permits(self, steps_trained: int) -> bool:
        """Another rebuild after an incarnation that trained `steps_trained` steps before its trainer died."""
        return self._next(steps_trained) <= self.allowed

    def take(self, steps_trained: int) -> int:
        self.in_a_row = self._next(steps_trained)
        return self.in_a_row

    def refusal(self, reason: str) -> str:
        """The run's one stop line once no rebuild is left."""
        if self.allowed == 0:
            return reason
        death, _, hint = reason.partition("; ")
        return (f"{death}, and so did each of the {self.in_a_row} trainer(s) rebuilt in a row before it, before a "
                f"train step (train.max_rebuilds = {self.allowed}){'; ' + hint if hint else ''}")

    def record(self, run_dir: Path, lost: TrainerLost) -> None:
        """One `trainer_rebuild` line in metrics.jsonl (`turnkeep plot` marks it like the other restarts)."""
        append_jsonl(run_dir / "metrics.jsonl", {
            "kind": MetricsKind.TRAINER_REBUILD, "t": round(time.time(), 3), "reason": lost.reason,
            "steps_trained": lost.steps_trained, "rebuild_in_a_row": self.in_a_row,
            "max_rebuilds": self.allowed}, durable=True)

    def announcement(self, lost: TrainerLost) -> str:
        death = lost.reason.split("; ")[0]
        return (f"turnkeep: {death}; rebuilding the trainer and restoring into it ({self.in_a_row} of at most "
                f"{self.allowed} in a row), keeping the policy engines and environment servers")
