"""What a step of a snapshot raises when the attempt cannot go on, in the controller or a GPU-side process; the
activities turn these into Temporal errors (`activities/errors.py`), so no process below them imports Temporal."""

from __future__ import annotations


class InvariantBroken(Exception):
    """A bug: a continuation that points at nothing, a step that moved under the hold."""


class TrainerMoved(Exception):
    """A train step finished before the cut of an attempt without a hold of its own: one without the trainer hold,
    or a journal attempt whose train pump's checkpoint hold was gone before its cut."""

    def __init__(self, anchor: int, step: int, checkpoint_hold: bool = False) -> None:
        if checkpoint_hold:
            super().__init__(
                f"trainer_state_changed: the train pump's checkpoint hold was gone before the cut (step {anchor} -> "
                f"{step}: its lease ran out, or the run released it); the attempt is skipped and the next "
                "checkpoint's attempt takes its place. If this repeats, raise snapshot.lease_s."
            )
            return
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
