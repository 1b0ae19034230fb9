"""The environment server: runs agent loops over HTTP for the controller.

Routes: `POST /attach` (the run hands over its policy engines' URLs, limits and tokenizer files), `PUT /engines`
(the controller's routable policy engines now; agents' calls are routed over them by `envs/engine_router.py`),
`POST /run` (a RolloutRequest; answers with a RolloutResult whose receipt must be ACKed; an evaluation's
episode: `envs/eval_agent.py`), `POST /ack`, `POST /cancel`, `POST /cancel_all`, `POST /judge`, `GET /health`,
and the checkpoint participant routes `/checkpoint/*` (see `env_participant` and `participants.http_server`).
Every route but `/health` needs the bearer token the server was started with. The same server runs inside the
run (the `env` Ray actor, attached in-process) and stand-alone (`turnkeep env-server`, attached over HTTP by
every run or incarnation that uses it). A rollout runs as its own task, so a cancel (or a controller that went
away) stops exactly that agent; a /run that arrives while a checkpoint holds the door waits in that task before
it starts, so it can be cancelled too.
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

from turnkeep.envs.agent_loop import for_environment, run_agent
from turnkeep.envs.agent_registry import AgentRegistry
from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.engine_router import EngineRouter
from turnkeep.envs.env_participant import EnvParticipant, env_capabilities
from turnkeep.envs.environment import Environment
from turnkeep.envs.eval_agent import run_evaluation
from turnkeep.envs.journal_restore import hold_from_journal
from turnkeep.envs.kinds import EnvironmentFactory, capabilities_of
from turnkeep.envs.policy_client import PolicyCallError
from turnkeep.envs.receipts import ReceiptBook
from turnkeep.envs.replay import replay_to_boundary
from turnkeep.envs.restored_agents import RestoredAgents, RestoreError
from turnkeep.envs.server_errors import AttachRefused, NotAttached
from turnkeep.envs.server_routes import build_app
from turnkeep.envs.slow_tools import slow_tools
from turnkeep.envs.turn_audit import audit_chunk, audit_tokens_durable, audit_turn
from turnkeep.envs.turn_journal import TurnJournal
from turnkeep.envs.turn_records import TurnRecords
from turnkeep.participants.core import ParticipantCore, ParticipantFault
from turnkeep.participants.faults import FaultInjector
from turnkeep.participants.http_server import ControlAuth, add_participant_routes
from turnkeep.primitives.audit_log import AuditLog
from turnkeep.primitives.holds import HoldSet
from turnkeep.primitives.node_address import advertised_host, listen_host
from turnkeep.primitives.segment_format import JournalCorrupt
from turnkeep.schemas.choices import RecoveryMode
from turnkeep.schemas.config_services import EnvServerConfig
from turnkeep.schemas.environments import (
    AttachReply,
    AttachRequest,
    EnvironmentCapabilities,
    JudgeRequest,
    RolloutLimits,
)
from turnkeep.schemas.participant import Capabilities, JournalMark, RestoreReply, RestoreRequest, SavedAgent
from turnkeep.schemas.rollout import (
    RolloutOutcome,
    RolloutRequest,
    RolloutResult,
    TurnBoundary,
)

log = logging.getLogger("turnkeep.env")

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
        self.codec: TurnCodec | None = None
        self._policy: EngineRouter | None = None
        self._limits: RolloutLimits | None = None
        self.attachment: str | None = None
        self._model_files_dir: Path | None = None
        self.turn_journal = self._turn_journal(journal_dir, name, audit)
        self.records = TurnRecords(self.turn_journal)
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
        self.running: dict[str, asyncio.Task] = {}
        self._runner: web.AppRunner | None = None
        self._faults = FaultInjector()
        self._session: aiohttp.ClientSession | None = None

    def _capabilities(self, names: list[str], group_size: int) -> list[EnvironmentCapabilities]:
        return [capabilities_of(name, self.factory.loaded(name), group_size) for name in names]

    def attach_local(self, model_dir: Path, policy_urls: list[str], limits: RolloutLimits, attachment: str) -> None:
        """Attach in-process (the run's own environment server shares the model directory)."""
        self._attach(TurnCodec(model_dir), policy_urls, limits, attachment)

    def _attach(self, codec: TurnCodec, policy_urls: list[str], limits: RolloutLimits, attachment: str) -> None:
        assert self._session is not None, "start() the server before attaching it"
        self.codec, self._limits, self.attachment = codec, limits, attachment
        if self._policy is None:
            self._policy = EngineRouter(policy_urls, self._session)
        else:
            # The same router: its counters go on, and calls in flight finish on the engines they went to.
            self._policy.set_engines(policy_urls)

    def set_engines(self, urls: list[str]) -> int:
        """The controller's routable policy engines now (see `EngineRouter.set_engines`); answers their count.
        Raises NotAttached before a run has attached the server."""
        if self._policy is None:
            raise NotAttached()
        self._policy.set_engines(urls)
        return self._policy.stats()["totals"]["routable"]

    async def start(self) -> str:
        # The default connector allows 100 connections; every running agent needs one.
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        app = build_app(self, self._control)
        self._faults = add_participant_routes(
            app, self.participant, self._control, fault_injection=self._cfg.fault_injection, restore=self._restore,
            mark=self._mark,
        )
        if self._cfg.startup_faults is not None:
            self._faults.set(self._cfg.startup_faults)
        if self._audit is not None:
            self._audit.start()
        self._warming = self.factory.warm_up()  # an adapter's server starts now, not in the first episode's replay
        if self.turn_journal is not None:
            self._journal_flusher = asyncio.create_task(self.turn_journal.flush_forever(
                self._cfg.journal_flush_s, self._cfg.journal_keep_mib << 20), name="turn-journal")
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, listen_host(self._cfg.host), self._cfg.port)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://{advertised_host(self._cfg.host)}:{port}"

    async def stop(self) -> None:
        for task in list(self.running.values()):
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

    async def attach(self, request: AttachRequest) -> AttachReply:
        """Attach a run (its policy URL, limits and tokenizer files); a new run or incarnation drops the agents and
        results of the one before, and aborts the checkpoint it left prepared (that controller is gone: a server
        serves one attachment at a time). Raises AttachRefused when the same attachment is prepared for a
        checkpoint, or the files are unusable."""
        attachment = f"{request.run_id}:{request.incarnation}"
        if self.participant.current is not None and attachment == self.attachment:
            raise AttachRefused(409, f"prepared for checkpoint {self.participant.current}; attach after it is "
                                     "resumed or aborted")
        try:
            codec = await asyncio.to_thread(self._codec_from_files, request.model_files)
        except (OSError, ValueError) as err:
            raise AttachRefused(400, f"the model files do not make a tokenizer: {err}") from None
        if attachment != self.attachment:
            # Another run, or a new incarnation: the previous controller's agents, results and checkpoint are orphans.
            dropped = await self.stop_all_agents()
            aborted = self.participant.abandon()
            log.info("attached to %s as %r (was %s; dropped %s, aborted checkpoint %s)", attachment, request.name,
                     self.attachment, dropped, aborted)
        self._attach(codec, request.policy_urls or [request.policy_url], request.limits, attachment)
        if self.factory.answers_any_name:
            self.environments = self._capabilities([request.name], request.group_size)
            self.participant.rename(self._participant_capabilities(request.name))
        return AttachReply(name=self.participant.name, attachment=attachment, environments=self.environments)

    async def serve_rollout(self, request: RolloutRequest) -> RolloutResult:
        """Run one agent as its own task (a cancel stops exactly it) and answer with its result."""
        work = self._run(request) if request.evaluation_temperature is None else \
            run_evaluation(request, self.factory, self.codec, self._policy, self._limits)
        task = asyncio.get_running_loop().create_task(work)
        self.running[request.rollout_id] = task
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self.running.pop(request.rollout_id, None)

    def judge_inputs(self, request: JudgeRequest) -> tuple[type[Environment], list[list[str]]]:
        """The group-scored environment of a judge request, and every sibling's policy turns as text."""
        if self.codec is None:
            raise NotAttached()
        kind = self.factory.kind_of(request.problem.env)
        return kind, [[self.codec.turn_text(turn) for turn in sibling] for sibling in request.policy_turns]

    def cancel(self, rollout_id: str) -> bool:
        task = self.running.pop(rollout_id, None)
        if task is not None:
            task.cancel()
        return task is not None

    def health(self) -> dict:
        return {
            "running": len(self.running),
            "unacked": self.receipts.unacked(),
            "expired_results": self.receipts.expired,
            "turn_commits": self.records.commits,
            "boundary_holders": sorted(self.boundary_gate.holders()),
            "door_holders": sorted(self.door.holders()),
            "checkpoint_id": self.participant.current,
            "name": self.participant.name,
            "attachment": self.attachment,
            "policy_engines": self._policy.stats()["totals"] if self._policy is not None else None,
        }

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
            token_level = self._limits.partial_turn_environments if self._limits else []
            held, cannot_continue, stands = await hold_from_journal(self.turn_journal, self.restored,
                                                                     request.journal, token_level)
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
            env = self.factory.make_for(request)
        except ValueError as err:
            return _failed(request, str(err))
        async with self.agents.live(request, env) as agent:
            try:
                start = None
                if saved is not None:
                    start = await self._continue(env, saved, request)
                    self.records.commit(start, request=request, env=env)
                slow_tools(env, self._faults.tool_delay_s(request.problem.env))  # live calls only, not a replay's
                result = await run_agent(
                    request, env, self.codec, self._policy, self.records, lambda: self.agents.park(agent),
                    for_environment(self._limits, request.problem.env), start=start,
                    partial=saved.partial if saved is not None else None,
                    on_turn=lambda *turn: audit_turn(self._audit, request, *turn),
                    on_chunk=lambda *chunk: audit_chunk(self._audit, request, *chunk))
            except (PolicyCallError, aiohttp.ClientError, ValidationError, RuntimeError) as err:
                # RuntimeError: a tool that broke (a lab's process died) or a continuation that cannot go on.
                result = _failed(request, f"{type(err).__name__}: {err}")
            finally:
                self.records.forget(request.rollout_id)
                self._policy.forget(request.rollout_id)
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
            await replay_to_boundary(env, self.codec, boundary, request, self._replay_timeout_s(), self._audit)
        return boundary.model_copy(update={"rollout_id": request.rollout_id})

    def _replay_timeout_s(self) -> float:
        return self._limits.replay_timeout_s if self._limits else RolloutLimits.model_fields["replay_timeout_s"].default

    def _participant_capabilities(self, name: str) -> Capabilities:
        return env_capabilities(self.environments, name, journals_turns=self.turn_journal is not None)

    def _turn_journal(self, journal_dir: Path | None, name: str, audit) -> TurnJournal | None:
        if journal_dir is None:
            return None
        if audit is None:
            return TurnJournal(journal_dir, f"env/{name}")
        return TurnJournal(journal_dir, f"env/{name}", before_sync=self._flush_audit,
                           tokens_durable=lambda durable: audit_tokens_durable(self._audit, durable))

    def _flush_audit(self) -> None:
        try:
            self._audit.flush()
        except Exception:  # noqa: BLE001 - the audit log reports its own failures; the journal must not wait on it
            pass

    async def rebind_local(self, attachment: str, audit: AuditLog) -> dict:
        """The run's own server under a new controller incarnation (see `EnvServerActor.fence`)."""
        dropped = await self.stop_all_agents() if attachment != self.attachment else {}
        aborted = self.participant.abandon()
        if self._audit is not None:
            await self._audit.close()
        self._audit = audit
        audit.start()
        log.info("re-attached to %s (was %s; dropped %s, aborted checkpoint %s)", attachment, self.attachment,
                 dropped, aborted)
        self.attachment = attachment
        return {"dropped": dropped, "aborted_checkpoint": aborted}

    async def stop_all_agents(self) -> dict[str, int]:
        tasks = list(self.running.values())
        self.running.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # The controller is going away: results it never stored will never be ACKed.
        discarded = self.receipts.discard_all()
        return {"cancelled": len(tasks), "discarded_results": discarded}


def _failed(request: RolloutRequest, reason: str) -> RolloutResult:
    return RolloutResult(rollout_id=request.rollout_id, outcome=RolloutOutcome.FAILED, reason=reason)
