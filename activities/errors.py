"""How activity failures reach the workflow: retryable, refused, or a broken invariant."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from participants.errors import ParticipantInvariantBroken, ParticipantRefused, ParticipantUnavailable

INVARIANT = "InvariantBroken"  # the workflows match on this type name
REFUSED = "ParticipantRefused"
STALE = "StaleIncarnation"
TRAINER_MOVED = "TrainerMoved"


def invariant_broken(message: str) -> ApplicationError:
    return ApplicationError(message, type=INVARIANT, non_retryable=True)


def stale_incarnation(got: int, current: int) -> ApplicationError:
    # Benign: refusing a dead incarnation's leftovers is the expected path after every restart.
    return ApplicationError(
        f"activity from controller incarnation {got} refused: this controller is incarnation {current}",
        type=STALE, non_retryable=True, category=ApplicationErrorCategory.BENIGN,
    )


def trainer_moved(anchor: int, step: int) -> ApplicationError:
    return ApplicationError(
        f"trainer_state_changed: a train step finished during the Gym phase (step {anchor} -> {step}); "
        "the attempt is thrown away. snapshot.trainer_hold = true prevents this.",
        type=TRAINER_MOVED, non_retryable=True,
    )


@contextmanager
def participant_errors() -> Iterator[None]:
    """Transient participant failures stay retryable; a refusal or a broken invariant does not."""
    try:
        yield
    except ParticipantInvariantBroken as err:
        raise invariant_broken(str(err)) from err
    except ParticipantRefused as err:
        raise ApplicationError(str(err), type=REFUSED, non_retryable=True) from err
    except ParticipantUnavailable:
        raise
