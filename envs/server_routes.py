"""The environment server's HTTP routes (`envs/server.py` does the work): `POST /attach`, `/run`, `/ack`,
`/cancel`, `/cancel_all`, `/judge` and `PUT /engines` behind the run's bearer token and a body bound per route,
`GET /health` open;
the checkpoint participant routes (`/checkpoint/*`) answer only once a run has attached the server."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import ValidationError

from turnkeep.participants.http_server import ControlAuth, body_too_large
from turnkeep.schemas.environments import AttachRequest, EnginesUpdate, JudgeReply, JudgeRequest
from turnkeep.schemas.participant import ParticipantError
from turnkeep.schemas.rollout import AckRequest, CancelRequest, RolloutRequest

if TYPE_CHECKING:
    from turnkeep.envs.server import EnvServer

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



class AttachRefused(Exception):
    """The server will not attach this run now; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class NotAttached(Exception):
    """No run has attached this server yet."""


def build_app(server: EnvServer, control: ControlAuth) -> web.Application:
    @web.middleware
    async def attached_first(http: web.Request, handler) -> web.StreamResponse:
        # A stand-alone server that restarted answers no run's checkpoint calls until a run attaches it:
        # until then it does not even know its participant name, and nothing of any attempt lives in it.
        if http.path.startswith("/checkpoint/") and server.attachment is None:
            body = ParticipantError(error="no run is attached to this server yet; the run attaches it at start "
                                          "(POST /attach)", code="not_attached")
            return web.Response(status=503, text=body.model_dump_json(), content_type="application/json")
        return await handler(http)

    async def attach(http: web.Request) -> web.Response:
        try:
            request = AttachRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not an AttachRequest: {err}")
        try:
            reply = await server.attach(request)
        except AttachRefused as refused:
            return web.json_response({"error": str(refused)}, status=refused.status)
        return web.Response(body=reply.model_dump_json(), content_type="application/json")

    async def run(http: web.Request) -> web.Response:
        try:
            request = RolloutRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not a RolloutRequest: {err}")
        if server.attachment is None:
            return _not_attached()
        if request.rollout_id in server.running:
            return _bad_request(f"rollout {request.rollout_id} is already running; use a new attempt number")
        result = await server.serve_rollout(request)
        return web.Response(body=result.model_dump_json(), content_type="application/json")

    async def judge(http: web.Request) -> web.Response:
        if server.codec is None:
            return _not_attached()
        try:
            request = JudgeRequest.model_validate_json(await http.read())
            kind, texts = server.judge_inputs(request)
        except NotAttached:
            return _not_attached()
        except (ValidationError, ValueError, KeyError, IndexError, TypeError, OverflowError) as err:
            return _bad_request(f"cannot judge this group: {type(err).__name__}: {err}")
        try:
            rewards = kind.score_group(request.problem, texts)
        except (ValueError, NotImplementedError) as err:
            return _bad_request(f"cannot judge this group: {err}")
        return web.Response(body=JudgeReply(rewards=rewards).model_dump_json(), content_type="application/json")

    async def ack(http: web.Request) -> web.Response:
        try:
            request = AckRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not an AckRequest: {err}")
        return web.json_response({"was_pending": server.receipts.ack(request.receipt)})

    async def cancel(http: web.Request) -> web.Response:
        try:
            request = CancelRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not a CancelRequest: {err}")
        return web.json_response({"cancelled": server.cancel(request.rollout_id)})

    async def engines(http: web.Request) -> web.Response:
        try:
            request = EnginesUpdate.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not an EnginesUpdate: {err}")
        try:
            return web.json_response({"engines": server.set_engines(request.urls)})
        except NotAttached:
            return _not_attached()

    async def cancel_all(http: web.Request) -> web.Response:
        return web.json_response(await server.stop_all_agents())

    async def health(http: web.Request) -> web.Response:
        return web.json_response(server.health())

    async def auth(http: web.Request) -> web.Response:
        # A run checks its token here before it starts anything (`workers.remote_envs.probe_remote_servers`).
        return web.json_response({"token": "accepted"})

    app = web.Application(client_max_size=max(MAX_BODY_BYTES.values()), middlewares=[attached_first])
    guarded = {"/attach": attach, "/run": run, "/ack": ack, "/cancel": cancel, "/cancel_all": cancel_all,
               "/judge": judge}
    app.add_routes([web.post(path, _guarded(handler, control, MAX_BODY_BYTES[path]))
                    for path, handler in guarded.items()])
    app.add_routes([web.put("/engines", _guarded(engines, control, MAX_BODY_BYTES["/engines"])),
                    web.get("/health", health), web.get("/auth", _guarded(auth, control, 0))])
    return app


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
