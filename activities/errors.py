"""How activity failures reach the workflow: retryable, refused, or a broken invariant."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from controller.errors import InvariantBroken, TrainerMoved
from participants.errors import ParticipantInvariantBroken, ParticipantRefused, ParticipantUnavailable
from schemas.names import ErrorType


def invariant_broken(message: str) -> ApplicationError:
    return ApplicationError(message, type=ErrorType.INVARIANT_BROKEN, non_retryable=True)


def stale_incarnation(got: int, current: int) -> ApplicationError:
    # Benign: refusing a dead incarnation's leftovers is the expected path after every restart.
    return ApplicationError(
        f"activity from controller incarnation {got} refused: this controller is incarnation {current}",
        type=ErrorType.STALE_INCARNATION, non_retryable=True, category=ApplicationErrorCategory.BENIGN,
    )


def check_incarnation(got: int, current: int) -> None:
    if got != current:
        raise stale_incarnation(got, current)


@contextmanager
def translated_errors() -> Iterator[None]:
    """Controller and participant refusals as the error types the workflows match on.

    A broken invariant is never retried and stops the run; a participant's refusal fails
    the attempt; a participant that is unavailable stays retryable. Refusals and
    unavailability are expected outcomes (benign: logged without a traceback); a broken
    invariant is not.
    """
    try:
        yield
    except (InvariantBroken, ParticipantInvariantBroken) as err:
        raise invariant_broken(str(err)) from err
    except TrainerMoved as err:
        raise ApplicationError(str(err), type=ErrorType.TRAINER_MOVED, non_retryable=True,
                               category=ApplicationErrorCategory.BENIGN) from err
    except ParticipantRefused as err:
        raise participant_refused(str(err)) from err
    except ParticipantUnavailable as err:
        raise ApplicationError(str(err), type=ErrorType.PARTICIPANT_UNAVAILABLE,
                               category=ApplicationErrorCategory.BENIGN) from err


def participant_refused(message: str) -> ApplicationError:
    """An expected end of an attempt: the workflow's outcome and reason report it, so the worker logs no traceback."""
    return ApplicationError(message, type=ErrorType.PARTICIPANT_REFUSED, non_retryable=True,
                            category=ApplicationErrorCategory.BENIGN)
