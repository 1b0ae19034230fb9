"""What controller code raises when a snapshot cannot go on; the activities turn these
into Temporal errors (`activities/errors.py`), so the controller never imports Temporal."""

from __future__ import annotations


class InvariantBroken(Exception):
    """A bug: a continuation that points at nothing, a step that moved under the hold."""


class TrainerMoved(Exception):
    """A train step finished during the Gym phase of an attempt without a trainer hold."""

    def __init__(self, anchor: int, step: int) -> None:
        super().__init__(
            f"trainer_state_changed: a train step finished during the Gym phase (step {anchor} -> {step}); "
            "the attempt is thrown away. snapshot.trainer_hold = true prevents this."
        )


class AcksInFlight(Exception):
    """An ACK still unanswered at the cut: its server was prepared, so this should not happen; the attempt
    fails rather than save a row its server may save too."""

    def __init__(self, receipts: list[str]) -> None:
        super().__init__(f"{len(receipts)} ACKs still in flight at the cut ({', '.join(receipts[:3])}); this "
                         "attempt fails, the previous snapshot stays the restore point")
