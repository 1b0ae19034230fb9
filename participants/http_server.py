"""The checkpoint participant protocol over HTTP: aiohttp routes around a `ParticipantCore`.

Routes (all under `/checkpoint/`, all require `Authorization: Bearer <token>`):

    GET  capabilities                       -> Capabilities
    POST prepare  PrepareRequest            -> ParticipantStatus
    GET  status   ?checkpoint_id=<id>       -> ParticipantStatus (no id: unfenced, for operators)
    POST renew    LeaseRequest              -> ParticipantStatus
    POST commit   CommitRequest             -> CommitResult
    POST resume   CheckpointRef             -> ControlReply
    POST abort    CheckpointRef             -> ControlReply
    POST restore  RestoreRequest            -> RestoreReply (participants that save state)
    POST faults   FaultPlan                 -> FaultPlan (only with fault injection on)

Errors are a `ParticipantError` body: 400 `bad_request` (the message names the field),
401 `unauthorized`, 409 `wrong_checkpoint` / `not_prepared` / `released`, 413
`too_large`, 507 `io_error` (the write failed, e.g. ENOSPC: retryable), 5xx
`injected_fault`. The token is checked before a byte of the body is read, and every
body is bounded (`MAX_BODY_BYTES`, larger for `restore`, which may carry a snapshot's files).

The routes are mounted on the server's existing application, so they listen where the
server listens (loopback unless its config says otherwise); the token keeps other
local users out.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from turnkeep.participants.core import ParticipantCore, ParticipantFault
from turnkeep.participants.faults import FaultInjector
from turnkeep.participants.inline_files import InlineFilesError, pack_artifacts, unpack_into
from turnkeep.schemas.participant import (
    CheckpointRef,
    CommitRequest,
    FaultPlan,
    LeaseRequest,
    ParticipantError,
    PrepareRequest,
    RestoreRequest,
)

logger = logging.getLogger("turnkeep.participants")

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[BaseModel]]

STATUS_OF_CODE = {
    "bad_request": 400,
    "unauthorized": 401,
    "wrong_checkpoint": 409,
    "not_prepared": 409,
    "released": 409,
    "too_large": 413,
    "io_error": 507,
}

MAX_BODY_BYTES = 64 * 1024
"""A protocol call is a checkpoint id and a few numbers."""
MAX_RESTORE_BODY_BYTES = 1024 * 1024 * 1024
"""An inline restore carries a snapshot's saved agents (the application's `client_max_size` bounds it too)."""


@dataclass(frozen=True)
class ControlAuth:
    token: str | None
    """The run's control token; None refuses every checkpoint call (control disabled)."""
    where: str = "<run_dir>/control_token"
    """Where an operator finds the token (named in 401 replies)."""

    def allows(self, request: web.Request) -> bool:
        if not self.token:
            return False
        # aiohttp keeps undecodable header bytes as surrogates; they must compare unequal, not raise.
        sent = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        return hmac.compare_digest(sent, f"Bearer {self.token}".encode())

    def refusal(self) -> str:
        if not self.token:
            return "this server was started without a control token, so checkpoint control is disabled"
        return f"this route needs 'Authorization: Bearer <token>' with the token from {self.where}"


def add_participant_routes(
    app: web.Application, core: ParticipantCore, auth: ControlAuth, *, fault_injection: bool = False,
    restore: Callable[[RestoreRequest], Awaitable[BaseModel]] | None = None,
    mark: Callable[[str], Awaitable[BaseModel]] | None = None, faults: FaultInjector | None = None,
) -> FaultInjector:
    """Mount `/checkpoint/*` on `app`; returns the fault injector (idle unless enabled).

    `restore` serves `POST /checkpoint/restore` (a participant that saves state loads it back); `mark` serves
    `POST /checkpoint/mark` (a participant with a turn journal says where it stands, for a journal snapshot).
    `faults`: the participant's own injector, when its protocol is also called another way (Temporal).
    """
    faults = faults if faults is not None else FaultInjector()
    routes = _Routes(core, faults, restore, mark)
    handlers: dict[str, tuple[str, Handler]] = {
        "capabilities": ("GET", routes.capabilities),
        "prepare": ("POST", routes.prepare),
        "status": ("GET", routes.status),
        "renew": ("POST", routes.renew),
        "commit": ("POST", routes.commit),
        "resume": ("POST", routes.resume),
        "abort": ("POST", routes.abort),
    }
    if restore is not None:
        handlers["restore"] = ("POST", routes.restore)
    if mark is not None:
        handlers["mark"] = ("POST", routes.mark)
    if fault_injection:
        handlers["faults"] = ("POST", routes.set_faults)
    for route, (method, handler) in handlers.items():
        limit = MAX_RESTORE_BODY_BYTES if route == "restore" else MAX_BODY_BYTES
        app.router.add_route(method, f"/checkpoint/{route}", _guarded(route, handler, auth, faults, limit))
    return faults


class _Routes:
    def __init__(self, core: ParticipantCore, faults: FaultInjector, restore, mark) -> None:
        self._core = core
        self._faults = faults
        self._restore = restore
        self._mark = mark

    async def capabilities(self, request: web.Request) -> BaseModel:
        return self._core.capabilities

    async def prepare(self, request: web.Request) -> BaseModel:
        body = await _parse(request, PrepareRequest)
        return self._core.prepare(body.checkpoint_id, body.lease_s)

    async def status(self, request: web.Request) -> BaseModel:
        checkpoint_id = request.query.get("checkpoint_id")
        if checkpoint_id == "":
            raise ParticipantFault("bad_request", "checkpoint_id: must not be empty (omit it for an unfenced status)")
        return self._core.status(checkpoint_id)

    async def renew(self, request: web.Request) -> BaseModel:
        body = await _parse(request, LeaseRequest)
        return self._core.renew(body.checkpoint_id, body.lease_s)

    async def commit(self, request: web.Request) -> BaseModel:
        body = await _parse(request, CommitRequest)
        before_write = lambda: self._faults.enospc("commit")  # noqa: E731
        if body.directory is not None:
            return await self._core.commit(body.checkpoint_id, Path(body.directory), before_write=before_write)
        # Inline: write into a private scratch folder, answer with the files, keep nothing.
        with tempfile.TemporaryDirectory(prefix="turnkeep-commit-") as scratch:
            folder = Path(scratch) / self._core.name
            result = await self._core.commit(body.checkpoint_id, folder, before_write=before_write)
            files = await asyncio.to_thread(pack_artifacts, self._core.name, folder, result.artifacts)
        return result.model_copy(update={"files": files})

    async def resume(self, request: web.Request) -> BaseModel:
        return self._core.resume((await _parse(request, CheckpointRef)).checkpoint_id)

    async def abort(self, request: web.Request) -> BaseModel:
        return self._core.abort((await _parse(request, CheckpointRef)).checkpoint_id)

    async def restore(self, request: web.Request) -> BaseModel:
        body = await _parse(request, RestoreRequest)
        if body.directory is not None:
            directory = Path(body.directory)
            if not directory.is_absolute() or directory.name != self._core.name or ".." in directory.parts:
                raise ParticipantFault("bad_request", f"directory: must be the absolute path <snapshot>/"
                                                      f"{self._core.name}, got {body.directory}")
            return await self._restore(body)
        with tempfile.TemporaryDirectory(prefix="turnkeep-restore-") as scratch:
            folder = Path(scratch) / self._core.name
            try:
                await asyncio.to_thread(unpack_into, folder, body.files)
            except (InlineFilesError, ValueError) as err:
                raise ParticipantFault("bad_request", f"files: {err}") from None
            return await self._restore(body.model_copy(update={"directory": str(folder), "files": {}}))

    async def mark(self, request: web.Request) -> BaseModel:
        return await self._mark((await _parse(request, CheckpointRef)).checkpoint_id)

    async def set_faults(self, request: web.Request) -> BaseModel:
        plan = await _parse(request, FaultPlan)
        self._faults.set(plan)
        logger.warning("participant %s: fault plan set to %s", self._core.name, plan.model_dump_json())
        return plan


def _guarded(route: str, handler: Handler, auth: ControlAuth, faults: FaultInjector, max_body: int):
    async def serve(request: web.Request) -> web.Response:
        # The caller first, then the size, and only then the body: a stranger costs no memory.
        if not auth.allows(request):
            return _unread_error(401, "unauthorized", auth.refusal())
        if (too_large := body_too_large(request, max_body)) is not None:
            return _unread_error(413, "too_large", too_large)
        try:
            await request.read()
        except web.HTTPRequestEntityTooLarge as err:
            return _unread_error(413, "too_large", f"the body is larger than this server accepts ({err.text})")
        if (status := faults.take_failure(route)) is not None:
            return await _error(request, status, "injected_fault", f"injected failure of /checkpoint/{route}")
        try:
            reply = await handler(request)
        except ParticipantFault as fault:
            return await _error(request, STATUS_OF_CODE.get(fault.code, 400), fault.code, fault.message)
        except OSError as err:
            # Disk full or an I/O error while writing: the participant is still prepared,
            # so the coordinator retries the commit.
            logger.warning("/checkpoint/%s failed writing: %s", route, err)
            return await _error(request, 507, "io_error", f"writing artifacts failed: {err}")
        if delay := faults.delay_s(route):
            # After acting, like a slow drain or a slow disk: gates are already closed meanwhile.
            await asyncio.sleep(delay)
        return web.Response(text=reply.model_dump_json(), content_type="application/json")

    return serve


def body_too_large(request: web.Request, max_body: int) -> str | None:
    """Why the declared body is refused unread, or None (a chunked body is bounded by `client_max_size`)."""
    length = request.content_length
    if length is not None and length > max_body:
        return f"the body has {length} bytes; {request.path} accepts at most {max_body}"
    return None


def _unread_error(status: int, code: str, message: str) -> web.Response:
    body = ParticipantError(error=message, code=code)
    return web.Response(status=status, text=body.model_dump_json(), content_type="application/json")


async def _parse(request: web.Request, model: type[M]) -> M:
    try:
        return model.model_validate_json(await request.read())
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in err.errors())
        raise ParticipantFault("bad_request", f"not a {model.__name__}: {problems}") from None


async def _error(request: web.Request, status: int, code: str, message: str) -> web.Response:
    body = ParticipantError(error=message, code=code, checkpoint_id=await _checkpoint_id_of(request))
    return web.Response(status=status, text=body.model_dump_json(), content_type="application/json")


async def _checkpoint_id_of(request: web.Request) -> str | None:
    """The request's checkpoint id, best effort, so even an error reply echoes it."""
    if request.method == "GET":
        return request.query.get("checkpoint_id") or None
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return None
    value = body.get("checkpoint_id") if isinstance(body, dict) else None
    return value if isinstance(value, str) else None
