"""HTTP face of the policy server (aiohttp): completions, health, checkpoint routes.

The `/checkpoint/*` participant routes come from `participants.http_server`
around the server's `ParticipantCore` (see `policy_participant`).

Errors use OpenAI's shape, `{"error": {"message", "type", "param"}}`, and `param`
names the offending field, so an agent's log says what to fix. Requests are fully
validated here and in `PolicyServer._check_request` before vLLM sees them: a
malformed request that reaches vLLM's engine-core input thread can kill it and
hang every later call.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from pydantic import ValidationError

from turnkeep.gpu_workers.policy_errors import RequestError, WeightsUnavailable
from turnkeep.participants.http_server import ControlAuth, add_participant_routes
from turnkeep.schemas.policy import CompletionRequest, CompletionResponse, CompletionStreamLine

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from turnkeep.participants.core import ParticipantCore
    from turnkeep.participants.faults import FaultInjector

logger = logging.getLogger("turnkeep.policy_http")

SERVER_KEY: web.AppKey[Any] = web.AppKey("policy_server", object)

MAX_BODY_BYTES = 16 * 1024 * 1024
"""A completion request is a prompt of token ids: a million of them fit."""


class CompletionServer(Protocol):
    """What the routes ask of the policy server (`gpu_workers.policy_server.PolicyServer`), named here so that
    this module needs not import the server's: the server imports this one to build its app."""

    participant: ParticipantCore
    faults: FaultInjector

    async def complete(self, req: CompletionRequest) -> CompletionResponse: ...

    def streaming(self, req: CompletionRequest) -> AbstractAsyncContextManager[AsyncIterator[CompletionStreamLine]]:
        ...

    def health(self) -> dict[str, Any]: ...


def build_app(
    server: CompletionServer, control: ControlAuth = ControlAuth(None), fault_injection: bool = False
) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[SERVER_KEY] = server
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/health", _health)
    # One fault plan for the participant, whichever way its protocol is called (HTTP or Temporal).
    add_participant_routes(app, server.participant, control, fault_injection=fault_injection, faults=server.faults)
    return app


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param}}
    return web.json_response(body, status=status)


async def _parse(request: web.Request) -> CompletionRequest:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise RequestError(None, f"the body has {request.content_length} bytes; at most {MAX_BODY_BYTES} are "
                                 "accepted", status=413)
    try:
        body = await request.json(loads=json.loads)
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(None, f"the body is larger than the {MAX_BODY_BYTES} bytes accepted", status=413) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestError(None, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(None, "request body must be a JSON object")
    try:
        return CompletionRequest.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(f"{_param(e['loc'])}: {e['msg']}" for e in errors)
        raise RequestError(_param(errors[0]["loc"]), problems) from None


def _param(loc: tuple[int | str, ...]) -> str | None:
    """`prompt.3` for a bad list item; drops pydantic's union-member tags (`seed.int`)."""
    if not loc:
        return None
    parts = [str(loc[0])]
    for item in loc[1:]:
        if not isinstance(item, int):
            break
        parts.append(str(item))
    return ".".join(parts)


async def _completions(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER_KEY]
    try:
        req = await _parse(request)
        if req.stream:
            async with server.streaming(req) as lines:
                return await _stream(request, lines)
        resp = await server.complete(req)
    except RequestError as exc:
        return _error(exc.status, str(exc), exc.param)
    except WeightsUnavailable as exc:
        return _error(exc.status, str(exc), kind="service_unavailable")
    except ValueError as exc:
        # vLLM's own input checks (sampling parameters it refuses) raise ValueError.
        return _error(400, str(exc))
    except Exception as exc:
        logger.exception("completion failed")
        return _error(500, f"{type(exc).__name__}: {exc}", kind="server_error")
    return web.Response(text=resp.model_dump_json(), content_type="application/json")


async def _stream(request: web.Request, lines) -> web.StreamResponse:
    """Send the lines as they come. Once the status line is out, an engine failure can only end the stream with
    an `error` line (the client counts that as the engine's failure, like a 5xx)."""
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    try:
        async with contextlib.aclosing(lines):  # closed at once when the agent goes away: vLLM aborts the request
            async for line in lines:
                await response.write(line.model_dump_json(exclude_none=True).encode() + b"\n")
    except ConnectionResetError:
        logger.debug("the caller went away mid-stream (a cancelled or stopped agent)")
        return response
    except Exception as exc:  # noqa: BLE001 - reported on the stream, whose status was already sent
        logger.exception("streamed completion failed")
        failed = CompletionStreamLine(error=f"{type(exc).__name__}: {exc}")
        await response.write(failed.model_dump_json(exclude_none=True).encode() + b"\n")
    await response.write_eof()
    return response


async def _health(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVER_KEY].health())
