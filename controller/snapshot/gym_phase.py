"""The Gym phase of an attempt across the environment servers: prepare, commit, release.

prepare parks every environment server's agents (the policy server is fenced after
this, by its own activity, because a mid-turn agent needs its policy call answered to
reach its boundary). A participant is anything with the participant client's methods
(`participants.client.ParticipantClient` over HTTP, or a participant core in the same
process, as `turnkeep bench scaling` drives one).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from schemas.participant import Artifact, CommitResult, ControlReply, ParticipantStatus

POLL_S = 0.05


class Participant(Protocol):
    name: str

    async def prepare(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus: ...
    async def status(self, checkpoint_id: str) -> ParticipantStatus: ...
    async def renew(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus: ...
    async def commit(self, checkpoint_id: str, directory: str | Path) -> CommitResult: ...
    async def resume(self, checkpoint_id: str) -> ControlReply: ...
    async def abort(self, checkpoint_id: str) -> ControlReply: ...


Renew = Callable[[], Awaitable[None]]
"""Renews every lease the attempt holds outside the participant being waited on."""


@dataclass(frozen=True)
class Prepared:
    participant_s: float
    agents_parked_s: float
    """From the start of prepare until every environment server had all its agents parked."""


@dataclass(frozen=True)
class Committed:
    participant_s: float
    artifacts: list[Artifact]
    counts: dict[str, int]


async def prepare_participants(
    environments: Sequence[Participant], checkpoint_id: str, lease_s: float, renew_others: Renew,
    agents_parked: Renew | None = None,
) -> Prepared:
    started = time.monotonic()
    for env in environments:
        await until_ready(env, checkpoint_id, lease_s, renew_others)
    agents_parked_s = time.monotonic() - started
    if agents_parked is not None:
        await agents_parked()
    return Prepared(participant_s=round(time.monotonic() - started, 3), agents_parked_s=round(agents_parked_s, 4))


async def until_ready(participant: Participant, checkpoint_id: str, lease_s: float, renew_others: Renew) -> ParticipantStatus:
    """Prepare, then poll its status until it is ready, renewing the leases a third of the way through each."""
    status = await participant.prepare(checkpoint_id, lease_s)
    last_renew = time.monotonic()
    while not status.ready:
        await asyncio.sleep(POLL_S)
        if time.monotonic() - last_renew > lease_s / 3:
            await renew_others()
            await participant.renew(checkpoint_id, lease_s)
            last_renew = time.monotonic()
        status = await participant.status(checkpoint_id)
    return status


async def commit_participants(
    participants: Sequence[Participant], checkpoint_id: str, staging_dir: Path, after_each: Renew | None = None
) -> Committed:
    """Each participant writes into `<staging>/<name>/`; their manifests and counts add up."""
    started = time.monotonic()
    artifacts: list[Artifact] = []
    counts: dict[str, int] = {}
    for participant in participants:
        result = await participant.commit(checkpoint_id, str(staging_dir / participant.name))
        artifacts += result.artifacts
        for key, value in result.counts.items():
            counts[key] = counts.get(key, 0) + value
        if after_each is not None:
            await after_each()
    return Committed(participant_s=round(time.monotonic() - started, 3), artifacts=artifacts, counts=counts)


async def release_participants(environments: Sequence[Participant], checkpoint_id: str, abort: bool) -> float:
    """Resume (or abort) every environment server; each call is idempotent. Returns the seconds it took."""
    started = time.monotonic()
    for participant in environments:
        if abort:
            await participant.abort(checkpoint_id)
        else:
            await participant.resume(checkpoint_id)
    return round(time.monotonic() - started, 3)
