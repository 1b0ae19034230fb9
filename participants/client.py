"""HTTP client of one checkpoint participant (an environment server or the policy server).

The `gym.*` activities drive participants through this. It checks every reply the way
the protocol promises: the reply validates as the expected model, comes from the
participant it was sent to, and is about the checkpoint id that was asked about (a
reply for another id means two coordinators or a fencing bug). Failures come out as
the three error kinds of `participants.errors`, so the activity only decides what to
retry.

`commit` passes the participant's own directory, `<snapshot root>/<name>`; the
participant answers with artifact paths relative to the snapshot root
(`<name>/<file>`), ready for the manifest.
"""

from __future__ import annotations

import asyncio
from pathlib import Path, PurePosixPath
from typing import TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from turnkeep.participants.errors import (
    ParticipantCallError,
    ParticipantInvariantBroken,
    ParticipantRefused,
    ParticipantUnavailable,
)
from turnkeep.participants.inline_files import InlineFilesError, pack_folder, write_artifacts
from turnkeep.schemas.participant import (
    Capabilities,
    CheckpointRef,
    CommitRequest,
    CommitResult,
    ControlReply,
    FaultPlan,
    JournalMark,
    LeaseRequest,
    ParticipantError,
    ParticipantStatus,
    PrepareRequest,
    RestoreReply,
    RestoreRequest,
    RunningAgent,
)

M = TypeVar("M", bound=BaseModel)


class ParticipantClient:
    def __init__(
        self, name: str, base_url: str, token: str, session: aiohttp.ClientSession, timeout_s: float = 30.0,
        inline_files: bool = False,
    ) -> None:
        """`inline_files`: the participant may run on another machine, so its files travel in the calls."""
        self.name = name
        self.inline_files = inline_files
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def capabilities(self) -> Capabilities:
        return await self._call("GET", "capabilities", Capabilities, None)

    async def prepare(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus:
        body = PrepareRequest(checkpoint_id=checkpoint_id, lease_s=lease_s)
        return await self._call("POST", "prepare", ParticipantStatus, checkpoint_id, body)

    async def status(self, checkpoint_id: str) -> ParticipantStatus:
        return await self._call(
            "GET", "status", ParticipantStatus, checkpoint_id, params={"checkpoint_id": checkpoint_id}
        )

    async def renew(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus:
        body = LeaseRequest(checkpoint_id=checkpoint_id, lease_s=lease_s)
        return await self._call("POST", "renew", ParticipantStatus, checkpoint_id, body)

    async def commit(self, checkpoint_id: str, directory: str | Path) -> CommitResult:
        """Have the participant write into `directory` (its own folder, `<snapshot root>/<name>`)."""
        if not self.inline_files:
            body = CommitRequest(checkpoint_id=checkpoint_id, directory=str(directory))
            result = await self._call("POST", "commit", CommitResult, checkpoint_id, body)
            self._check_artifacts(result)
            return result
        body = CommitRequest(checkpoint_id=checkpoint_id, inline=True)
        result = await self._call("POST", "commit", CommitResult, checkpoint_id, body)
        self._check_artifacts(result)
        try:
            await asyncio.to_thread(write_artifacts, self.name, Path(directory), result.files, result.artifacts)
        except (InlineFilesError, ValueError) as err:
            raise ParticipantInvariantBroken(self.name, "commit", str(err)) from None
        return result.model_copy(update={"files": {}})

    async def resume(self, checkpoint_id: str) -> ControlReply:
        body = CheckpointRef(checkpoint_id=checkpoint_id)
        return await self._call("POST", "resume", ControlReply, checkpoint_id, body)

    async def abort(self, checkpoint_id: str) -> ControlReply:
        body = CheckpointRef(checkpoint_id=checkpoint_id)
        return await self._call("POST", "abort", ControlReply, checkpoint_id, body)

    async def restore(self, checkpoint_id: str, directory: str | Path) -> RestoreReply:
        """Have the participant load its folder of a snapshot and hold it until continued."""
        if self.inline_files:
            body = RestoreRequest(checkpoint_id=checkpoint_id, files=await asyncio.to_thread(pack_folder, Path(directory)))
        else:
            body = RestoreRequest(checkpoint_id=checkpoint_id, directory=str(directory))
        return await self._call("POST", "restore", RestoreReply, checkpoint_id, body)

    async def restore_from_journal(self, checkpoint_id: str, wanted: dict[str, RunningAgent]) -> RestoreReply:
        """Have the participant hold the newest journaled boundary of each wanted rollout (see `RunningAgent`);
        `RestoreReply.held` says where each one stands."""
        body = RestoreRequest(checkpoint_id=checkpoint_id, journal=wanted)
        return await self._call("POST", "restore", RestoreReply, checkpoint_id, body)

    async def mark(self, checkpoint_id: str) -> JournalMark:
        """Have an environment server make its turn journal durable and say where it stands."""
        return await self._call("POST", "mark", JournalMark, checkpoint_id, CheckpointRef(checkpoint_id=checkpoint_id))

    async def set_faults(self, plan: FaultPlan) -> FaultPlan:
        """Replace the participant's fault plan (only served with fault injection on)."""
        return await self._call("POST", "faults", FaultPlan, None, plan)

    # -- internals ---------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        route: str,
        expect: type[M],
        checkpoint_id: str | None,
        body: BaseModel | None = None,
        params: dict[str, str] | None = None,
    ) -> M:
        url = f"{self.base_url}/checkpoint/{route}"
        data = body.model_dump_json() if body is not None else None
        headers = {**self._headers, "Content-Type": "application/json"}
        try:
            async with self._session.request(
                method, url, data=data, params=params, headers=headers, timeout=self._timeout
            ) as resp:
                status, raw = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise ParticipantUnavailable(self.name, route, f"no reply from {url}: {type(err).__name__}: {err}") from err
        if status != 200:
            raise self._failure(route, status, raw, checkpoint_id)
        try:
            reply = expect.model_validate_json(raw)
        except ValidationError as err:
            problem = f"malformed participant reply (not a {expect.__name__}): {_short(err)}; body {raw[:200]!r}"
            raise ParticipantInvariantBroken(self.name, route, problem) from None
        self._check_reply(route, reply, checkpoint_id)
        return reply

    def _failure(self, route: str, status: int, raw: bytes, checkpoint_id: str | None) -> ParticipantCallError:
        try:
            error: ParticipantError | None = ParticipantError.model_validate_json(raw)
        except ValidationError:
            error = None
        text = error.error if error else raw[:300].decode(errors="replace")
        code = error.code if error else None
        message = f"HTTP {status} ({code or 'no error code'}): {text}"
        if status >= 500:
            return ParticipantUnavailable(self.name, route, message, code)
        if error is not None and (code == "wrong_checkpoint" or error.checkpoint_id not in (None, checkpoint_id)):
            return ParticipantInvariantBroken(self.name, route, f"asked about {checkpoint_id}: {message}", code)
        return ParticipantRefused(self.name, route, message, code)

    def _check_reply(self, route: str, reply: BaseModel, checkpoint_id: str | None) -> None:
        name = getattr(reply, "name", self.name)
        if name != self.name:
            raise ParticipantInvariantBroken(
                self.name, route, f"reply comes from participant {name!r}; is the URL {self.base_url} the right one?"
            )
        if checkpoint_id is None:
            return
        answered = getattr(reply, "checkpoint_id", None)
        if answered != checkpoint_id:
            raise ParticipantInvariantBroken(
                self.name, route, f"asked about checkpoint {checkpoint_id}, reply is about {answered}"
            )

    def _check_artifacts(self, result: CommitResult) -> None:
        for artifact in result.artifacts:
            path = PurePosixPath(artifact.path)
            if path.is_absolute() or ".." in path.parts or path.parts[:1] != (self.name,):
                problem = f"artifact path {artifact.path!r} is not inside the participant's folder {self.name}/"
                raise ParticipantInvariantBroken(self.name, "commit", problem)


def _short(err: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in err.errors()[:5])
