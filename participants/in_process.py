"""A participant core behind the participant client's async methods, without HTTP.

For a participant that lives in the caller's own process: the policy server's own
activities drive its core this way, and `turnkeep bench scaling` an environment's, so
both wait for readiness with the same code as the controller (`participants.readiness.until_ready`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from turnkeep.participants.core import ParticipantCore
from turnkeep.schemas.participant import CommitResult, ControlReply, ParticipantStatus


class InProcessParticipant:
    def __init__(self, core: ParticipantCore, before_write: Callable[[], None] | None = None) -> None:
        """`before_write` runs before commit writes (fault injection's ENOSPC)."""
        self.name = core.name
        self._core = core
        self._before_write = before_write

    async def prepare(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus:
        return self._core.prepare(checkpoint_id, lease_s)

    async def status(self, checkpoint_id: str) -> ParticipantStatus:
        return self._core.status(checkpoint_id)

    async def renew(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus:
        return self._core.renew(checkpoint_id, lease_s)

    async def commit(self, checkpoint_id: str, directory: str | Path) -> CommitResult:
        return await self._core.commit(checkpoint_id, Path(directory), before_write=self._before_write)

    async def resume(self, checkpoint_id: str) -> ControlReply:
        return self._core.resume(checkpoint_id)

    async def abort(self, checkpoint_id: str) -> ControlReply:
        return self._core.abort(checkpoint_id)
