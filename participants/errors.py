"""What can go wrong calling a checkpoint participant, sorted by what the caller should do.

- `ParticipantUnavailable`: transient (HTTP 5xx, 507 from a failed write such as ENOSPC,
  connection refused, timeout). The activity retries it.
- `ParticipantRefused`: the participant answered a clear no (unauthorized, not prepared,
  checkpoint already released), or `ParticipantNotReady`: it did not get ready within the
  attempt's prepare budget. The attempt fails; the run goes on.
- `ParticipantInvariantBroken`: a reply about another checkpoint id, a `wrong_checkpoint`
  refusal, or a reply that is not the protocol's model. That is a bug: the activity
  raises it as a non-retryable error and the run stops.

No Temporal imports here: activities translate these into `ApplicationError`s.
"""

from __future__ import annotations


class ParticipantCallError(Exception):
    """Base: a call to participant `participant` on `route` failed."""

    retryable = False

    def __init__(self, participant: str, route: str, message: str, code: str | None = None) -> None:
        # Everything in args, so the error survives pickling (Ray, Temporal).
        super().__init__(participant, route, message, code)
        self.participant = participant
        self.route = route
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return f"participant {self.participant} /checkpoint/{self.route}: {self.message}"


class ParticipantUnavailable(ParticipantCallError):
    """Transient failure: retry."""

    retryable = True


class ParticipantRefused(ParticipantCallError):
    """The participant refused the call (a 4xx other than wrong_checkpoint)."""


class ParticipantNotReady(ParticipantRefused):
    """Prepared, but not ready within the attempt's prepare budget; the message says what it waits on."""

    def __init__(self, participant: str, waited_s: float, budget_s: float, waiting_on: str) -> None:
        message = (f"not ready after {waited_s:.1f} s (snapshot.prepare_timeout_s allows {budget_s:.1f} s in all): "
                   f"{waiting_on or 'it reported nothing it waits on'}")
        super().__init__(participant, "status", message, "not_ready")
        self.args = (participant, waited_s, budget_s, waiting_on)


class ParticipantInvariantBroken(ParticipantCallError):
    """The participant's reply breaks the protocol: a bug, never retried."""
