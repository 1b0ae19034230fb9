"""The environment server: runs agent loops over HTTP for the controller.

Routes: `POST /attach` (the run hands over its policy URL, limits and tokenizer files),
`POST /run` (a RolloutRequest; answers with a RolloutResult whose receipt must be
ACKed), `POST /ack`, `POST /cancel`, `POST /cancel_all`, `POST /judge`, `GET /health`,
and the checkpoint participant routes `/checkpoint/*` (see `env_participant` and
`participants.http_server`). Every route but `/health` needs the bearer token the
server was started with. The same server runs inside the run (the `env` Ray actor,
attached in-process) and stand-alone (`turnkeep env-server`, attached over HTTP by
every run or incarnation that uses it). A
rollout runs as its own task, so a cancel (or a controller that went away) stops
exactly that agent; a /run that arrives while a checkpoint holds the door waits in
that task before it starts, so it can be cancelled too.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from pathlib import Path

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from envs.agent_loop import LoopLimits, run_agent
from envs.agent_registry import AgentRegistry
from envs.codec import TurnCodec
from envs.env_participant import EnvParticipant, env_capabilities
from envs.environment import Environment
from envs.journal_restore import hold_from_journal
from envs.kinds import EnvironmentFactory, capabilities_of
from envs.policy_client import PolicyCallError, PolicyClient
from envs.receipts import ReceiptBook
from envs.restored_agents import RestoredAgents, RestoreError
from envs.slow_tools import slow_tools
from envs.turn_journal import TurnJournal
from envs.turn_records import TurnRecords
from participants.core import ParticipantCore, ParticipantFault
from participants.faults import FaultInjector
from participants.http_server import ControlAuth, add_participant_routes, body_too_large
from primitives.audit_log import AuditLog
from primitives.holds import HoldSet
from primitives.segment_format import JournalCorrupt
from schemas.audit import TurnCommitted
from schemas.choices import RecoveryMode
from schemas.config import EnvServerConfig
from schemas.environments import (
    AttachReply,
    AttachRequest,
    EnvironmentCapabilities,
    JudgeReply,
    JudgeRequest,
)
from schemas.participant import Capabilities, JournalMark, ParticipantError, RestoreReply, RestoreRequest, SavedAgent
from schemas.rollout import (
    AckRequest,
    CancelRequest,
    RolloutOutcome,
    RolloutRequest,
    RolloutResult,
    Segment,
    TurnBoundary,
)

log = logging.getLogger("turnkeep.env")

MAX_BODY_BYTES = {
    "/attach": 256 * 1024 * 1024,  # a real model's tokenizer files
    "/run": 8 * 1024 * 1024,
    "/judge": 64 * 1024 * 1024,  # every sibling's turns
    "/ack": 64 * 1024,
    "/cancel": 64 * 1024,
    "/cancel_all": 64 * 1024,
}
"""Per route, checked against the declared length before the body is read (after the token)."""


class EnvServer:
    def __init__(
        self,
        factory: EnvironmentFactory,
        cfg: EnvServerConfig,
        control: ControlAuth = ControlAuth(None),
        audit: AuditLog | None = None,
        name: str = "env",
        group_size: int = 8,
        journal_dir: Path | None = None,
    ) -> None:
        """`journal_dir`: journal every committed turn boundary there (`envs.turn_journal`), so a restore from a
        trainer checkpoint continues the agents that were running; None keeps no journal."""
        self.factory = factory
        self._cfg = cfg
        self._control = control
        self._group_size = group_size
        # Set by attach: a server runs no agent before a run has told it its policy and tokenizer.
        self._codec: TurnCodec | None = None
        self._policy: PolicyClient | None = None
        self._limits: LoopLimits | None = None
        self.attachment: str | None = None
        self._model_files_dir: Path | None = None
        self.records = TurnRecords()
        self.turn_journal = TurnJournal(journal_dir, f"env/{name}") if journal_dir is not None else None
        self.records.journal = self.turn_journal
        if self.turn_journal is not None and audit is not None:
            self.turn_journal.before_sync = self._flush_audit
        self._journal_flusher: asyncio.Task | None = None
        self.receipts = ReceiptBook()
        self.door = HoldSet("env-door")
        self.boundary_gate = HoldSet("env-boundary")
        self.agents = AgentRegistry(self.door, self.boundary_gate)
        self.environments = self._capabilities(factory.names(), group_size)
        self.participant = ParticipantCore(
            self._participant_capabilities(name),
            EnvParticipant(self.agents, self.records, self.receipts, self.door, self.boundary_gate,
                           before_write=audit.flush if audit is not None else None),
        )
        self.restored = RestoredAgents(self.factory)
        self._audit = audit
        self._running: dict[str, asyncio.Task] = {}
        self._runner: web.AppRunner | None = None
        self._faults = FaultInjector()
        self._session: aiohttp.ClientSession | None = None

    def _capabilities(self, names: list[str], group_size: int) -> list[EnvironmentCapabilities]:
        return [capabilities_of(name, self.factory.loaded(name), group_size) for name in names]

    def attach_local(self, model_dir: Path, policy_url: str, limits: LoopLimits, attachment: str) -> None:
        """Attach in-process (the run's own environment server shares the model directory)."""
        self._attach(TurnCodec(model_dir), policy_url, limits, attachment)

    def _attach(self, codec: TurnCodec, policy_url: str, limits: LoopLimits, attachment: str) -> None:
        assert self._session is not None, "start() the server before attaching it"
        self._codec, self._limits, self.attachment = codec, limits, attachment
        self._policy = PolicyClient(policy_url, self._session)

    async def start(self) -> str:
        # The default connector allows 100 connections; every running agent needs one.
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=max(MAX_BODY_BYTES.values()), middlewares=[self._attached_first])
        guarded = {
            "/attach": self._handle_attach,
            "/run": self._handle_run,
            "/ack": self._handle_ack,
            "/cancel": self._handle_cancel,
            "/cancel_all": self._handle_cancel_all,
            "/judge": self._handle_judge,
        }
        app.add_routes([web.post(path, self._guarded(handler, MAX_BODY_BYTES[path])) for path, handler in guarded.items()])
        app.add_routes([web.get("/health", self._handle_health)])
        self._faults = add_participant_routes(
            app, self.participant, self._control, fault_injection=self._cfg.fault_injection, restore=self._restore,
            mark=self._mark,
        )
        if self._cfg.startup_faults is not None:
            self._faults.set(self._cfg.startup_faults)
        if self._audit is not None:
            self._audit.start()
        if self.turn_journal is not None:
            self._journal_flusher = asyncio.create_task(self.turn_journal.flush_forever(
                self._cfg.journal_flush_s, self._cfg.journal_keep_mib << 20), name="turn-journal")
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._cfg.host, self._cfg.port)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://{self._cfg.host}:{port}"

    async def stop(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        if self._audit is not None:
            await self._audit.close()
        if self._journal_flusher is not None:
            self._journal_flusher.cancel()
            await asyncio.gather(self._journal_flusher, return_exceptions=True)
        if self.turn_journal is not None:
            await self.turn_journal.sync()
            self.turn_journal.close()
        if self._model_files_dir is not None:
            shutil.rmtree(self._model_files_dir, ignore_errors=True)

    @web.middleware
    async def _attached_first(self, http: web.Request, handler) -> web.StreamResponse:
        # A stand-alone server that restarted answers no run's checkpoint calls until a run attaches it:
        # until then it does not even know its participant name, and nothing of any attempt lives in it.
        if http.path.startswith("/checkpoint/") and self.attachment is None:
            body = ParticipantError(error="no run is attached to this server yet; the run attaches it at start "
                                          "(POST /attach)", code="not_attached")
            return web.Response(status=503, text=body.model_dump_json(), content_type="application/json")
        return await handler(http)

    def _guarded(self, handler, max_body: int):
        async def serve(http: web.Request) -> web.Response:
            if not self._control.allows(http):
                return web.json_response({"error": self._control.refusal()}, status=401)
            if (too_large := body_too_large(http, max_body)) is not None:
                return web.json_response({"error": too_large}, status=413)
            try:
                return await handler(http)
            except web.HTTPRequestEntityTooLarge as err:
                return web.json_response({"error": f"the body is larger than this server accepts: {err.text}"},
                                         status=413)

        return serve

    async def _handle_attach(self, http: web.Request) -> web.Response:
        try:
            request = AttachRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not an AttachRequest: {err}")
        if self.participant.current is not None:
            return web.json_response({"error": f"prepared for checkpoint {self.participant.current}; attach after "
                                               "it is resumed or aborted"}, status=409)
        attachment = f"{request.run_id}:{request.incarnation}"
        try:
            codec = await asyncio.to_thread(self._codec_from_files, request.model_files)
        except (OSError, ValueError) as err:
            return _bad_request(f"the model files do not make a tokenizer: {err}")
        if attachment != self.attachment:
            # Another run, or a new incarnation: the previous controller's agents and results are orphans.
            dropped = await self._stop_all_agents()
            log.info("attached to %s as %r (was %s; dropped %s)", attachment, request.name, self.attachment, dropped)
        self._attach(codec, request.policy_url, LoopLimits(**request.limits.model_dump()), attachment)
        if self.factory.answers_any_name:
            self.environments = self._capabilities([request.name], request.group_size)
            self.participant.rename(self._participant_capabilities(request.name))
        reply = AttachReply(name=self.participant.name, attachment=attachment, environments=self.environments)
        return web.Response(body=reply.model_dump_json(), content_type="application/json")

    def _codec_from_files(self, files: dict[str, str]) -> TurnCodec:
        folder = Path(tempfile.mkdtemp(prefix="turnkeep-model-files-"))
        for name, text in files.items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"model file name {name!r} must be a plain file name")
            (folder / name).write_text(text, encoding="utf-8")
        codec = TurnCodec(folder)
        if self._model_files_dir is not None:
            shutil.rmtree(self._model_files_dir, ignore_errors=True)
        self._model_files_dir = folder
        return codec

    async def _restore(self, request: RestoreRequest) -> RestoreReply:
        """Hold the snapshot's saved agents (or the journal's newest boundaries) until `/run` continues each one
        (`resume_from`)."""
        if request.journal:
            return await self._restore_from_journal(request)
        try:
            restored, cannot_continue = await self.restored.load(Path(request.directory))
        except RestoreError as err:
            raise ParticipantFault("bad_request", str(err)) from None
        log.info("restored %d saved agents from %s (%d of restart_only environments start over)",
                 len(restored), request.directory, len(cannot_continue))
        return RestoreReply(name=self.participant.name, checkpoint_id=request.checkpoint_id, restored=restored,
                            cannot_continue=cannot_continue)

    async def _mark(self, checkpoint_id: str) -> JournalMark:
        """Every boundary committed so far made durable, and where the journal stands (a journal snapshot's
        record of this server: nothing is parked or written)."""
        if self.turn_journal is None:
            raise ParticipantFault("bad_request", f"environment server {self.participant.name} keeps no turn journal, "
                                                  "so a snapshot cannot keep its agents there; start it with a journal "
                                                  "directory (turnkeep env-server --journal-dir), or set "
                                                  "snapshot.agents = \"parked\"")
        position = await self.turn_journal.sync()
        return JournalMark(name=self.participant.name, checkpoint_id=checkpoint_id, log_id=self.turn_journal.log_id,
                           seq=position.seq, chain=position.chain)

    async def _restore_from_journal(self, request: RestoreRequest) -> RestoreReply:
        if self.turn_journal is None:
            raise ParticipantFault("bad_request", f"environment server {self.participant.name} keeps no turn journal, "
                                                  "so it cannot continue agents from it; start it with a journal "
                                                  "directory (turnkeep env-server --journal-dir)")
        try:
            held, cannot_continue, stands = await hold_from_journal(self.turn_journal, self.restored, request.journal)
        except RestoreError as err:
            raise ParticipantFault("bad_request", str(err)) from None
        except JournalCorrupt as err:
            # Damage costs only the work the journal held: every running agent starts over, as without one.
            log.warning("the turn journal cannot be read (%s); the %d running agents start over", err,
                        len(request.journal))
            held, cannot_continue, stands = [], [], []
        log.info("restored %d of %d running agents from the turn journal %s (%d of restart_only environments start "
                 "over)", len(held), len(request.journal), self.turn_journal.directory, len(cannot_continue))
        return RestoreReply(name=self.participant.name, checkpoint_id=request.checkpoint_id, restored=held,
                            cannot_continue=cannot_continue, held=stands)

    async def _handle_run(self, http: web.Request) -> web.Response:
        try:
            request = RolloutRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not a RolloutRequest: {err}")
        if self.attachment is None:
            return _not_attached()
        if request.rollout_id in self._running:
            return _bad_request(f"rollout {request.rollout_id} is already running; use a new attempt number")
        task = asyncio.get_running_loop().create_task(self._run(request))
        self._running[request.rollout_id] = task
        try:
            result = await asyncio.shield(task)
        finally:
            if task.done():
                self._running.pop(request.rollout_id, None)
        return web.Response(body=result.model_dump_json(), content_type="application/json")

    async def _run(self, request: RolloutRequest) -> RolloutResult:
        if self._faults.crash_rollout(request.problem.env):
            return _failed(request, f"the {request.problem.env} tool crashed (injected fault)")
        saved = None
        if request.resume_from is not None:
            saved = self.restored.take(request.resume_from)
            if saved is None:
                return _failed(request, f"no restored agent {request.resume_from} on this server; "
                                        "rerun the sibling from scratch")
        try:
            env = slow_tools(self.factory.make(request.problem), self._faults.tool_delay_s(request.problem.env))
        except ValueError as err:
            return _failed(request, str(err))
        async with self.agents.live(request) as agent:
            agent.env = env
            try:
                start = None
                if saved is not None:
                    start = await self._continue(env, saved, request)
                    self.records.commit(start, request=request, env=env)
                result = await run_agent(
                    request, env, self._codec, self._policy, self.records, lambda: self.agents.park(agent),
                    self._limits, start=start, on_turn=lambda turn, seg: self._audit_turn(request, turn, seg),
                )
            except (PolicyCallError, aiohttp.ClientError, ValidationError, RuntimeError) as err:
                # RuntimeError: a tool that broke (a lab's process died) or a continuation that cannot go on.
                result = _failed(request, f"{type(err).__name__}: {err}")
            finally:
                self.records.forget(request.rollout_id)
                await env.close()
            # Still inside `live`: the agent leaves the registry and its result becomes
            # unACKed in one step, so a checkpoint never sees it in neither.
            return self.receipts.issue(result) if result.row is not None else result

    async def _continue(self, env: Environment, saved: SavedAgent, request: RolloutRequest) -> TurnBoundary:
        """Bring a fresh environment to the saved boundary: restore its exported state, or replay its turns."""
        boundary = saved.boundary
        if env.recovery_mode == RecoveryMode.EXPORTED:
            env.restore_state(saved.env_state or {})
        else:
            # The turns as the environment saw them, then the template glue each observation must give back.
            turns = [self._codec.turn_text(seg.token_ids) for seg in boundary.segments if seg.kind == "policy"]
            replayed = await env.replay(turns)
            if not self._codec.replay_matches(boundary.segments, replayed):
                saved_glue = [self._codec.decode(glue) for _, glue in self._codec.turns_with_glue(boundary.segments)]
                raise ContinuationError(
                    f"replaying {request.resume_from}'s {len(turns)} turns gave tool replies {replayed!r}, not the "
                    f"{saved_glue!r} the snapshot saved: the {env.kind} environment is not stateless"
                )
        return boundary.model_copy(update={"rollout_id": request.rollout_id})

    async def _handle_judge(self, http: web.Request) -> web.Response:
        if self._codec is None:
            return _not_attached()
        try:
            request = JudgeRequest.model_validate_json(await http.read())
            kind = self.factory.kind_of(request.problem.env)
            texts = [[self._codec.turn_text(turn) for turn in sibling] for sibling in request.policy_turns]
        except (ValidationError, ValueError, KeyError, IndexError, TypeError, OverflowError) as err:
            return _bad_request(f"cannot judge this group: {type(err).__name__}: {err}")
        try:
            rewards = kind.score_group(request.problem, texts)
        except (ValueError, NotImplementedError) as err:
            return _bad_request(f"cannot judge this group: {err}")
        return web.Response(body=JudgeReply(rewards=rewards).model_dump_json(), content_type="application/json")

    def _participant_capabilities(self, name: str) -> Capabilities:
        return env_capabilities(self.environments, name, journals_turns=self.turn_journal is not None)

    def _flush_audit(self) -> None:
        try:
            self._audit.flush()
        except Exception:  # noqa: BLE001 - the audit log reports its own failures; the journal must not wait on it
            pass

    def _audit_turn(self, request: RolloutRequest, turn: int, segment: Segment) -> None:
        if self._audit is not None:
            self._audit.emit(
                TurnCommitted, rollout_id=request.rollout_id, group_id=request.group_id, sibling=request.sibling,
                attempt=request.attempt, turn=turn, policy_version=segment.policy_version or 0,
                tokens=len(segment.token_ids), started_by=request.incarnation,
            )

    async def _handle_ack(self, http: web.Request) -> web.Response:
        try:
            ack = AckRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not an AckRequest: {err}")
        return web.json_response({"was_pending": self.receipts.ack(ack.receipt)})

    async def _handle_cancel(self, http: web.Request) -> web.Response:
        try:
            cancel = CancelRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not a CancelRequest: {err}")
        task = self._running.pop(cancel.rollout_id, None)
        if task is not None:
            task.cancel()
        return web.json_response({"cancelled": task is not None})

    async def _handle_cancel_all(self, http: web.Request) -> web.Response:
        return web.json_response(await self._stop_all_agents())

    async def rebind_local(self, attachment: str, audit: AuditLog) -> dict:
        """The run's own server under a new controller incarnation (see `EnvServerActor.fence`)."""
        dropped = await self._stop_all_agents() if attachment != self.attachment else {}
        aborted = self.participant.abandon()
        if self._audit is not None:
            await self._audit.close()
        self._audit = audit
        audit.start()
        log.info("re-attached to %s (was %s; dropped %s, aborted checkpoint %s)", attachment, self.attachment,
                 dropped, aborted)
        self.attachment = attachment
        return {"dropped": dropped, "aborted_checkpoint": aborted}

    async def _stop_all_agents(self) -> dict[str, int]:
        tasks = list(self._running.values())
        self._running.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # The controller is going away: results it never stored will never be ACKed.
        discarded = self.receipts.discard_all()
        return {"cancelled": len(tasks), "discarded_results": discarded}

    async def _handle_health(self, http: web.Request) -> web.Response:
        return web.json_response(
            {
                "running": len(self._running),
                "unacked": self.receipts.unacked(),
                "expired_results": self.receipts.expired,
                "turn_commits": self.records.commits,
                "boundary_holders": sorted(self.boundary_gate.holders()),
                "door_holders": sorted(self.door.holders()),
                "checkpoint_id": self.participant.current,
                "name": self.participant.name,
                "attachment": self.attachment,
            }
        )


class ContinuationError(RuntimeError):
    """A saved agent cannot be brought back to its boundary; its sibling reruns from scratch."""


def _failed(request: RolloutRequest, reason: str) -> RolloutResult:
    return RolloutResult(rollout_id=request.rollout_id, outcome=RolloutOutcome.FAILED, reason=reason)


def _bad_request(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


def _not_attached() -> web.Response:
    return web.json_response({"error": "no run is attached to this server yet; the run attaches it at start "
                                       "(POST /attach)"}, status=503)
