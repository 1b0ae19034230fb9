"""Which activity failures the worker logs as expected (benign, no traceback) and which it logs loudly."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from turnkeep.activities.errors import translated_errors
from turnkeep.participants.errors import ParticipantNotReady, ParticipantRefused, ParticipantUnavailable
from turnkeep.primitives.snapshot_errors import InvariantBroken
from turnkeep.schemas.names import ErrorType


def _translated(err: Exception) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught, translated_errors():
        raise err
    return caught.value


def test_a_refusal_ends_the_attempt_quietly() -> None:
    err = _translated(ParticipantRefused("env", "prepare", "unauthorized"))
    assert err.type == ErrorType.PARTICIPANT_REFUSED and err.non_retryable
    assert err.category == ApplicationErrorCategory.BENIGN
    assert "participant env /checkpoint/prepare: unauthorized" in str(err)


def test_a_participant_not_ready_is_a_refusal() -> None:
    err = _translated(ParticipantNotReady("env", 3.0, 2.0, "rollout 7 mid-turn"))
    assert err.type == ErrorType.PARTICIPANT_REFUSED and "rollout 7 mid-turn" in str(err)


def test_an_unavailable_participant_stays_retryable_and_quiet() -> None:
    err = _translated(ParticipantUnavailable("trainer", "hold", "connection refused"))
    assert err.type == ErrorType.PARTICIPANT_UNAVAILABLE and not err.non_retryable
    assert err.category == ApplicationErrorCategory.BENIGN


def test_a_broken_invariant_is_loud_and_final() -> None:
    err = _translated(InvariantBroken("two cuts for one attempt"))
    assert err.type == ErrorType.INVARIANT_BROKEN and err.non_retryable
    assert err.category != ApplicationErrorCategory.BENIGN


def test_a_process_that_died_mid_attempt_fails_it_quietly_with_the_reason() -> None:
    """The trainer killed during gym.commit (its lease renewal): the run stops on the death in one line of its own,
    and the attempt's failure is benign, logged without a traceback."""
    from ray.exceptions import ActorDiedError

    err = _translated(ActorDiedError())
    assert err.type == ErrorType.PARTICIPANT_UNAVAILABLE and not err.non_retryable
    assert err.category == ApplicationErrorCategory.BENIGN
    assert str(err).endswith("a process the attempt needs died: The actor died unexpectedly before finishing this task.")
