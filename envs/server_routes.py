"""The environment server's HTTP routes (`envs/server.py` does the work): `POST /attach`, `/run`, `/ack`,
`/cancel`, `/cancel_all`, `/judge` and `PUT /engines` behind the run's bearer token and a body bound per route,
`GET /health` open;
the checkpoint participant routes (`/checkpoint/*`) answer only once a run has attached the server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aiohttp import web
from pydantic import ValidationError

from turnkeep.envs.server_errors import AttachRefused, NotAttached
from turnkeep.participants.http_server import ControlAuth, body_too_large
from turnkeep.schemas.environments import AttachReply, AttachRequest, EnginesUpdate, JudgeReply, JudgeRequest
from turnkeep.schemas.participant import ParticipantError
from turnkeep.schemas.rollout import AckRequest, CancelRequest, RolloutRequest, RolloutResult

if TYPE_CHECKING:
    import asyncio

    from turnkeep.envs.codec import TurnCodec
    from turnkeep.envs.environment import Environment
    from turnkeep.envs.receipts import ReceiptBook

MAX_BODY_BYTES = {
    "/attach": 256 * 1024 * 1024,  # a real model's tokenizer files
    "/run": 8 * 1024 * 1024,
    "/judge": 64 * 1024 * 1024,  # every sibling's turns
    "/ack": 64 * 1024,
    "/cancel": 64 * 1024,
    "/cancel_all": 64 * 1024,
    "/engines": 64 * 1024,
}
"""Per route, checked against the declared length before the body is read (after the token)."""


class RoutedServer(Protocol):
    """What the routes ask of the environment server (`envs.server.EnvServer`), named here so that this module
    needs not import the server's: the server imports this one to build its app."""

    attachment: str | None
    running: dict[str, asyncio.Task]
    codec: TurnCodec | None
    receipts: ReceiptBook

    async def attach(self, request: AttachRequest) -> AttachReply: ...

    async def serve_rollout(self, request: RolloutRequest) -> RolloutResult: ...

    def judge_inputs(self, request: JudgeRequest) -> tuple[type[Environment], list[list[str]]]: ...

    def cancel(self, rollout_id: str) -> bool: ...

    def set_engines(self, urls: list[str]) -> int: ...

    async def stop_all_agents(self) -> dict[str, int]: ...

    def health(self) -> dict: ...


def build_app(server: RoutedServer, control: ControlAuth) -> web.Application:
    routes = _Routes(server)
    app = web.Application(client_max_size=max(MAX_BODY_BYTES.values()), middlewares=[routes.attached_first])
    guarded = {"/attach": routes.attach, "/run": routes.run, "/ack": routes.ack, "/cancel": routes.cancel,
               "/cancel_all": routes.cancel_all, "/judge": routes.judge}
    app.add_routes([web.post(path, _guarded(handler, control, MAX_BODY_BYTES[path]))
                    for path, handler in guarded.items()])
    app.add_routes([web.put("/engines", _guarded(routes.engines, control, MAX_BODY_BYTES["/engines"])),
                    web.get("/health", routes.health), web.get("/auth", _guarded(routes.auth, control, 0))])
    return app


class _Routes:
    """One handler per route over one server; the bearer token and body bound are checked before (`_guarded`)."""

    def __init__(self, server: RoutedServer) -> None:
        self._server = server

    @web.middleware
    async def attached_first(self, http: web.Request, handler) -> web.StreamResponse:
        # A stand-alone server that restarted answers no run's checkpoint calls until a run attaches it:
        # until then it does not even know its participant name, and nothing of any attempt lives in it.
        if http.path.startswith("/checkpoint/") and self._server.attachment is None:
            body = ParticipantError(error="no run is attached to this server yet; the run attaches it at start "
                                          "(POST /attach)", code="not_attached")
            return web.Response(status=503, text=body.model_dump_json(), content_type="application/json")
        return await handler(http)

    async def attach(self, http: web.Request) -> web.Response:
        try:
            request = AttachRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not an AttachRequest: {err}")
        try:
            reply = await self._server.attach(request)
        except AttachRefused as refused:
            return web.json_response({"error": str(refused)}, status=refused.status)
        return web.Response(body=reply.model_dump_json(), content_type="application/json")

    async def run(self, http: web.Request) -> web.Response:
        try:
            request = RolloutRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not a RolloutRequest: {err}")
        if self._server.attachment is None:
            return _not_attached()
        if request.rollout_id in self._server.running:
            return _bad_request(f"rollout {request.rollout_id} is already running; use a new attempt number")
        result = await self._server.serve_rollout(request)
        return web.Response(body=result.model_dump_json(), content_type="application/json")

    async def judge(self, http: web.Request) -> web.Response:
        if self._server.codec is None:
            return _not_attached()
        try:
            request = JudgeRequest.model_validate_json(await http.read())
            kind, texts = self._server.judge_inputs(request)
        except NotAttached:
            return _not_attached()
        except (ValidationError, ValueError, KeyError, IndexError, TypeError, OverflowError) as err:
            return _bad_request(f"cannot judge this group: {type(err).__name__}: {err}")
        try:
            rewards = kind.score_group(request.problem, texts)
        except (ValueError, NotImplementedError) as err:
            return _bad_request(f"cannot judge this group: {err}")
        return web.Response(body=JudgeReply(rewards=rewards).model_dump_json(), content_type="application/json")

    async def ack(self, http: web.Request) -> web.Response:
        try:
            request = AckRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not an AckRequest: {err}")
        return web.json_response({"was_pending": self._server.receipts.ack(request.receipt)})

    async def cancel(self, http: web.Request) -> web.Response:
        try:
            request = CancelRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not a CancelRequest: {err}")
        return web.json_response({"cancelled": self._server.cancel(request.rollout_id)})

    async def engines(self, http: web.Request) -> web.Response:
        try:
            request = EnginesUpdate.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not an EnginesUpdate: {err}")
        try:
            return web.json_response({"engines": self._server.set_engines(request.urls)})
        except NotAttached:
            return _not_attached()

    async def cancel_all(self, http: web.Request) -> web.Response:
        return web.json_response(await self._server.stop_all_agents())

    async def health(self, http: web.Request) -> web.Response:
        return web.json_response(self._server.health())

    async def auth(self, http: web.Request) -> web.Response:
        # A run checks its token here before it starts anything (`workers.remote_envs.probe_remote_servers`).
        return web.json_response({"token": "accepted"})


def _guarded(handler, control: ControlAuth, max_body: int):
    async def serve(http: web.Request) -> web.Response:
        if not control.allows(http):
            return web.json_response({"error": control.refusal()}, status=401)
        if (too_large := body_too_large(http, max_body)) is not None:
            return web.json_response({"error": too_large}, status=413)
        try:
            return await handler(http)
        except web.HTTPRequestEntityTooLarge as err:
            return web.json_response({"error": f"the body is larger than this server accepts: {err.text}"},
                                     status=413)

    return serve


def _bad_request(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


def _not_attached() -> web.Response:
    return web.json_response({"error": "no run is attached to this server yet; the run attaches it at start "
                                       "(POST /attach)"}, status=503)
