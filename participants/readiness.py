"""Waiting for one checkpoint participant to be ready: the same loop for the controller's environment servers
(`controller.snapshot.env_server_phase`) and for an engine's own Temporal worker (`activities.policy_activities`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from turnkeep.participants.errors import ParticipantNotReady
from turnkeep.schemas.participant import CommitResult, ControlReply, JournalMark, ParticipantStatus

POLL_S = 0.05


class Participant(Protocol):
    name: str

    async def prepare(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus: ...
    async def status(self, checkpoint_id: str) -> ParticipantStatus: ...
    async def renew(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus: ...
    async def commit(self, checkpoint_id: str, directory: str | Path) -> CommitResult: ...
    async def resume(self, checkpoint_id: str) -> ControlReply: ...
    async def abort(self, checkpoint_id: str) -> ControlReply: ...
    async def mark(self, checkpoint_id: str) -> JournalMark: ...


Renew = Callable[[], Awaitable[None]]
"""Renews every lease the attempt holds outside the participant being waited on."""


async def until_ready(
    participant: Participant, checkpoint_id: str, lease_s: float, renew_others: Renew, budget_s: float | None = None,
) -> ParticipantStatus:
    """Prepare, then poll its status until it is ready, renewing the leases a third of the way through each.

    Past `budget_s` it raises `ParticipantNotReady` with the participant's own account of what it waits on
    (an unACKed result of rollout X, agents mid-turn), so the attempt's reason says more than a timeout.
    """
    started = time.monotonic()
    status = await participant.prepare(checkpoint_id, lease_s)
    last_renew = time.monotonic()
    while not status.ready:
        waited = time.monotonic() - started
        if budget_s is not None and waited >= budget_s:
            raise ParticipantNotReady(participant.name, waited, budget_s, status.detail)
        await asyncio.sleep(POLL_S)
        if time.monotonic() - last_renew > lease_s / 3:
            await renew_others()
            await participant.renew(checkpoint_id, lease_s)
            last_renew = time.monotonic()
        status = await participant.status(checkpoint_id)
    return status
