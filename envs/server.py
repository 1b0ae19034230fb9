"""The environment server: runs agent loops over HTTP for the controller.

Routes: `POST /run` (a RolloutRequest; answers with a RolloutResult whose receipt must
be ACKed), `POST /ack`, `POST /cancel`, `GET /health`, and the checkpoint participant
routes `/checkpoint/*` (see `env_participant` and `participants.http_server`). A
rollout runs as its own task, so a cancel (or a controller that went away) stops
exactly that agent; a /run that arrives while a checkpoint holds the door waits in
that task before it starts, so it can be cancelled too.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from envs.agent_loop import LoopLimits, run_agent
from envs.agent_registry import AgentRegistry
from envs.codec import TurnCodec
from envs.env_participant import EnvParticipant, env_capabilities
from envs.environment import EnvContext, Environment
from envs.kinds import EnvironmentFactory, environment_capabilities
from envs.policy_client import PolicyCallError, PolicyClient
from envs.receipts import ReceiptBook
from envs.restored_agents import RestoredAgents, RestoreError
from envs.turn_records import TurnRecords
from participants.core import ParticipantCore, ParticipantFault
from participants.faults import FaultInjector
from participants.http_server import ControlAuth, add_participant_routes
from primitives.audit_log import AuditLog
from primitives.holds import HoldSet
from schemas.audit import TurnCommitted
from schemas.config import EnvironmentSpec, EnvServerConfig
from schemas.environments import JudgeReply, JudgeRequest
from schemas.participant import RestoreReply, RestoreRequest, SavedAgent
from schemas.rollout import AckRequest, RolloutOutcome, RolloutRequest, RolloutResult, Segment, TurnBoundary

log = logging.getLogger("turnkeep.env")


class EnvServer:
    def __init__(
        self,
        model_dir: Path,
        policy_url: str,
        cfg: EnvServerConfig,
        limits: LoopLimits,
        control: ControlAuth = ControlAuth(None),
        audit: AuditLog | None = None,
        environments: dict[str, EnvironmentSpec] | None = None,
        group_size: int = 8,
        workspace_root: Path | None = None,
    ) -> None:
        environments = environments if environments is not None else {"calc": EnvironmentSpec()}
        self._codec = TurnCodec(model_dir)
        self._policy_url = policy_url
        self._cfg = cfg
        self._limits = limits
        self._control = control
        self.records = TurnRecords()
        self.receipts = ReceiptBook()
        self.door = HoldSet("env-door")
        self.boundary_gate = HoldSet("env-boundary")
        self.agents = AgentRegistry(self.door, self.boundary_gate)
        self.environments = environment_capabilities(environments, group_size)
        self.factory = EnvironmentFactory(environments, EnvContext(cfg.tool_latency_s, workspace_root))
        self.participant = ParticipantCore(
            env_capabilities(self.environments),
            EnvParticipant(self.agents, self.records, self.receipts, self.door, self.boundary_gate,
                           before_write=audit.flush if audit is not None else None),
        )
        self.restored = RestoredAgents(self.factory)
        self._audit = audit
        self._running: dict[str, asyncio.Task] = {}
        self._runner: web.AppRunner | None = None
        self._faults = FaultInjector()
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        # The default connector allows 100 connections; every running agent needs one.
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        self._policy = PolicyClient(self._policy_url, self._session)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes(
            [
                web.post("/run", self._handle_run),
                web.post("/ack", self._handle_ack),
                web.post("/cancel", self._handle_cancel),
                web.post("/cancel_all", self._handle_cancel_all),
                web.post("/judge", self._handle_judge),
                web.get("/health", self._handle_health),
            ]
        )
        self._faults = add_participant_routes(
            app, self.participant, self._control, fault_injection=self._cfg.fault_injection, restore=self._restore
        )
        if self._cfg.startup_faults is not None:
            self._faults.set(self._cfg.startup_faults)
        if self._audit is not None:
            self._audit.start()
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

    async def _restore(self, request: RestoreRequest) -> RestoreReply:
        """Hold the snapshot's saved agents until `/run` continues each one (`resume_from`)."""
        try:
            restored, cannot_continue = await self.restored.load(Path(request.directory))
        except RestoreError as err:
            raise ParticipantFault("bad_request", str(err)) from None
        log.info("restored %d saved agents from %s (%d of restart_only environments start over)",
                 len(restored), request.directory, len(cannot_continue))
        return RestoreReply(name=self.participant.name, checkpoint_id=request.checkpoint_id, restored=restored,
                            cannot_continue=cannot_continue)

    async def _handle_run(self, http: web.Request) -> web.Response:
        try:
            request = RolloutRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not a RolloutRequest: {err}")
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
            env = self.factory.make(request.problem)
        except ValueError as err:
            return _failed(request, str(err))
        async with self.agents.live(request) as agent:
            agent.env = env
            try:
                start = None
                if saved is not None:
                    start = await self._continue(env, saved, request)
                    self.records.commit(start)
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
        if env.recovery_mode == "exported":
            env.restore_state(saved.env_state or {})
        else:
            turns = [self._codec.decode(seg.token_ids) for seg in boundary.segments if seg.kind == "policy"]
            replayed = [obs for obs in await env.replay(turns) if obs is not None]
            saved_tools = [seg.token_ids for seg in boundary.segments if seg.kind == "tool"]
            if [self._codec.encode(obs) for obs in replayed] != saved_tools:
                raise ContinuationError(
                    f"replaying {request.resume_from}'s {len(turns)} turns gave tool replies {replayed!r}, not the "
                    f"{[self._codec.decode(t) for t in saved_tools]!r} the snapshot saved: the {env.kind} "
                    "environment is not stateless"
                )
        return boundary.model_copy(update={"rollout_id": request.rollout_id})

    async def _handle_judge(self, http: web.Request) -> web.Response:
        try:
            request = JudgeRequest.model_validate_json(await http.read())
            kind = self.factory.kind_of(request.problem.env)
            texts = [[self._codec.decode(turn) for turn in sibling] for sibling in request.policy_turns]
            rewards = kind.score_group(request.problem, texts)
        except (ValidationError, ValueError, NotImplementedError) as err:
            return _bad_request(f"cannot judge this group: {err}")
        return web.Response(body=JudgeReply(rewards=rewards).model_dump_json(), content_type="application/json")

    def _audit_turn(self, request: RolloutRequest, turn: int, segment: Segment) -> None:
        if self._audit is not None:
            self._audit.emit(
                TurnCommitted, rollout_id=request.rollout_id, group_id=request.group_id, sibling=request.sibling,
                attempt=request.attempt, turn=turn, policy_version=segment.policy_version or 0,
                tokens=len(segment.token_ids),
            )

    async def _handle_ack(self, http: web.Request) -> web.Response:
        try:
            ack = AckRequest.model_validate_json(await http.read())
        except ValidationError as err:
            return _bad_request(f"not an AckRequest: {err}")
        return web.json_response({"was_pending": self.receipts.ack(ack.receipt)})

    async def _handle_cancel(self, http: web.Request) -> web.Response:
        body = await http.json()
        task = self._running.pop(str(body.get("rollout_id")), None)
        if task is not None:
            task.cancel()
        return web.json_response({"cancelled": task is not None})

    async def _handle_cancel_all(self, http: web.Request) -> web.Response:
        tasks = list(self._running.values())
        self._running.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # The controller is going away: results it never stored will never be ACKed.
        discarded = self.receipts.discard_all()
        return web.json_response({"cancelled": len(tasks), "discarded_results": discarded})

    async def _handle_health(self, http: web.Request) -> web.Response:
        return web.json_response(
            {
                "running": len(self._running),
                "unacked": self.receipts.unacked(),
                "turn_commits": self.records.commits,
                "boundary_holders": sorted(self.boundary_gate.holders()),
                "door_holders": sorted(self.door.holders()),
                "checkpoint_id": self.participant.current,
            }
        )


class ContinuationError(RuntimeError):
    """A saved agent cannot be brought back to its boundary; its sibling reruns from scratch."""


def _failed(request: RolloutRequest, reason: str) -> RolloutResult:
    return RolloutResult(rollout_id=request.rollout_id, outcome=RolloutOutcome.FAILED, reason=reason)


def _bad_request(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)
