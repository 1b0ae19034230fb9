"""How activity failures reach the workflow: retryable, refused, or a broken invariant."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ray.exceptions import RayActorError
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from turnkeep.participants.errors import ParticipantInvariantBroken, ParticipantRefused, ParticipantUnavailable
from turnkeep.primitives.snapshot_errors import AcksInFlight, InvariantBroken, TrainerMoved
from turnkeep.schemas.names import ErrorType


def invariant_broken(message: str) -> ApplicationError:
    return ApplicationError(message, type=ErrorType.INVARIANT_BROKEN, non_retryable=True)


def expected_failure(message: str, error_type: ErrorType, retryable: bool = False) -> ApplicationError:
    """A failure the workflow's outcome and reason report (benign: the worker logs it without a traceback)."""
    return ApplicationError(message, type=error_type, non_retryable=not retryable,
                            category=ApplicationErrorCategory.BENIGN)


def stale_incarnation(got: int, current: int) -> ApplicationError:
    # Refusing a dead incarnation's leftovers is the expected path after every restart.
    return expected_failure(f"activity from controller incarnation {got} refused: this controller is incarnation "
                            f"{current}", ErrorType.STALE_INCARNATION)


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
        raise expected_failure(str(err), ErrorType.TRAINER_MOVED) from err
    except AcksInFlight as err:
        raise expected_failure(str(err), ErrorType.PARTICIPANT_REFUSED) from err
    except ParticipantRefused as err:
        raise expected_failure(str(err), ErrorType.PARTICIPANT_REFUSED) from err
    except ParticipantUnavailable as err:
        raise expected_failure(str(err), ErrorType.PARTICIPANT_UNAVAILABLE, retryable=True) from err
    except RayActorError as err:
        # The trainer or the policy server died mid-attempt: the run stops on that with one line of its own, and
        # the attempt fails with the reason (no traceback in the output).
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise expected_failure(f"a process the attempt needs died: {first_line}", ErrorType.PARTICIPANT_UNAVAILABLE,
                               retryable=True) from err
