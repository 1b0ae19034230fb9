"""An attempt's phase over the environment servers (the `gym.*` activities): prepare, commit, release.

Every call fans out to all environment servers at once, so an attempt takes as long as
the slowest server, not the sum. prepare parks every environment server's agents (the policy server is fenced after
this, by its own activity, because a mid-turn agent needs its policy call answered to
reach its boundary). A participant is anything with the participant client's methods
(`participants.client.ParticipantClient` over HTTP, or a participant core in the same
process, as `turnkeep bench scaling` drives one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from turnkeep.participants.errors import ParticipantUnavailable
from turnkeep.participants.readiness import Participant, Renew, until_ready
from turnkeep.schemas.participant import Artifact, CommitResult, JournalMark

log = logging.getLogger("turnkeep.snapshot")

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
    agents_parked: Renew | None = None, budget_s: float | None = None,
) -> Prepared:
    """Prepare every environment server at once and wait until all are ready: as long as the slowest one.

    The first failure cancels the other waits and is raised; the attempt's compensation aborts them all.
    A server not ready within `budget_s` fails with what it still waits on.
    """
    started = time.monotonic()
    await _all_at_once(until_ready(env, checkpoint_id, lease_s, renew_others, budget_s) for env in environments)
    agents_parked_s = time.monotonic() - started
    if agents_parked is not None:
        await agents_parked()
    return Prepared(participant_s=round(time.monotonic() - started, 3), agents_parked_s=round(agents_parked_s, 4))


async def _all_at_once(calls) -> list:
    """Run the calls concurrently; the first exception cancels the rest and is raised as itself."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def commit_participants(
    participants: Sequence[Participant], checkpoint_id: str, staging_dir: Path, after_each: Renew | None = None
) -> Committed:
    """Each participant writes into `<staging>/<name>/`, all at once; their manifests and counts add up."""
    started = time.monotonic()

    async def commit_one(participant: Participant) -> CommitResult:
        result = await participant.commit(checkpoint_id, str(staging_dir / participant.name))
        if after_each is not None:
            await after_each()
        return result

    results = await _all_at_once(commit_one(p) for p in participants)
    artifacts: list[Artifact] = []
    counts: dict[str, int] = {}
    for result in results:
        artifacts += result.artifacts
        for key, value in result.counts.items():
            counts[key] = counts.get(key, 0) + value
    return Committed(participant_s=round(time.monotonic() - started, 3), artifacts=artifacts, counts=counts)


async def mark_participants(environments: Sequence[Participant], checkpoint_id: str) -> tuple[list[JournalMark], float]:
    """Every environment server's turn journal made durable and marked, all at once; (marks, seconds)."""
    started = time.monotonic()
    marks = await _all_at_once(env.mark(checkpoint_id) for env in environments)
    return list(marks), round(time.monotonic() - started, 3)


async def release_participants(environments: Sequence[Participant], checkpoint_id: str, abort: bool) -> float:
    """Resume (or abort) every environment server at once; each call is idempotent. Returns the seconds it took.

    An abort skips a server that does not answer: nothing of this attempt survives there (a dead
    server's gates died with it, a live one's lease releases them), and the compensation must not
    fail on it. A resume does not: a server left parked would hold its agents until its lease ends.
    """
    started = time.monotonic()

    async def release(participant: Participant) -> None:
        if not abort:
            await participant.resume(checkpoint_id)
            return
        try:
            await participant.abort(checkpoint_id)
        except ParticipantUnavailable as err:
            log.warning("abort of %s skipped %s, which does not answer (its lease releases it): %s",
                        checkpoint_id, participant.name, err)

    await _all_at_once(release(p) for p in environments)
    return round(time.monotonic() - started, 3)
