"""One `turnkeep run`: start everything it needs, restore if the run directory holds a
run, train until `steps`, stop everything.

Start order: run directory (new run, or the next incarnation of an existing one), the
audit log, Temporal (the embedded dev server unless `temporal.address` is set), Ray and
the three processes, the workers, the recovery workflow (on a restart), the run
workflow, then the pumps. Stop order is the reverse, and every piece is stopped even
when a later one failed to start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import ray

from turnkeep.config.temporal_environment import temporal_from_environment
from turnkeep.controller.engines.engine_keeper import EngineKeeper, engine_keeper, keep_engines
from turnkeep.controller.engines.scaled_count import count_at_start
from turnkeep.controller.errors import RunStopped
from turnkeep.controller.fingerprint import fingerprint_fields, process_digest
from turnkeep.controller.processes import Processes
from turnkeep.controller.restore.crash_restore import CrashRestore
from turnkeep.controller.restore.restore_source import has_trainer_checkpoint
from turnkeep.controller.restore.run_identity import RunIdentity, open_run_dir
from turnkeep.controller.rollout_levels import RolloutLevelPlan, plan_levels, unjournaled_turns_warning
from turnkeep.controller.runtime import Controller, RunSummary
from turnkeep.controller.snapshot.agents_mode import resolve_agents_mode
from turnkeep.controller.stores.trainer_checkpoint import CheckpointIdentity
from turnkeep.primitives import heartbeat
from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.primitives.audit_log import AUDIT_FILE, AuditLog
from turnkeep.primitives.pid_files import write_pid_file
from turnkeep.schemas.audit import RunEnded, RunStarted
from turnkeep.schemas.choices import AgentsMode, MetricsKind
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.names import ray_namespace
from turnkeep.schemas.participant import Capabilities
from turnkeep.schemas.recovery import RecoveryResult, SourceKind
from turnkeep.workers.eval_problems import run_eval_problems
from turnkeep.workers.model_source import with_model_resolved
from turnkeep.workers.rank_copies_default import with_rank_copies_decided
from turnkeep.workers.preemption import PreemptionHandler
from turnkeep.workers.process_watch import first_death, first_of
from turnkeep.workers.prompts import prompt_source
from turnkeep.workers.ray_cluster.head import RayHead, stop_head
from turnkeep.workers.ray_cluster.placement import join_ray, launch, reserve_gpus, shutdown
from turnkeep.workers.ray_cluster.reattach import reattach
from turnkeep.workers.ray_cluster.warden import beat_forever
from turnkeep.workers.remote_envs import attach_remote_servers, probe_remote_servers
from turnkeep.workers.run_observers import RunObservers, start_observers
from turnkeep.workers.startup_checks import check_before_start
from turnkeep.workers.startup_clock import StartupClock, marked
from turnkeep.workers.temporal.controller_worker import (
    SnapshotRuntime,
    participant_clients,
    start_snapshots,
    stop_snapshots,
)
from turnkeep.workers.temporal.dev_server import start_dev_server, stop_dev_server
from turnkeep.workers.temporal.service import check_temporal_service
from turnkeep.workers.temporal.supervisor import TemporalSupervisor
from turnkeep.workers.trainer_loss import KeptForRebuild, RebuildTerms, lose_trainer, rebuild_on_trainer_death
from turnkeep.workers.trainer_rebuilds import TrainerDiedAtStart, TrainerLost, TrainerRebuilds

log = logging.getLogger("turnkeep.run")

STOP_GRACE_AFTER_DEATH_S = 5.0


async def run_training(cfg: TurnkeepConfig, max_steps: int | None) -> RunSummary:
    # Participants in other processes get paths from us; they must not depend on our cwd.
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"run_dir": cfg.run.run_dir.resolve()})})
    cfg = with_rank_copies_decided(with_model_resolved(cfg))  # a hub id or GGUF file becomes its folder first
    start_count = count_at_start(cfg)  # the engines an operator scaled the run to, if the config is as it was
    cfg, temporal_note = temporal_from_environment(start_count.cfg)
    for note in (start_count.note, temporal_note):
        if note:
            print(f"turnkeep: {note}", flush=True)
    check_before_start(cfg)  # before anything is started or written
    await probe_remote_servers(cfg)
    await check_temporal_service(cfg)
    rebuilds = TrainerRebuilds(cfg.train.max_rebuilds)
    while True:
        try:
            return await _incarnation(cfg, max_steps, rebuilds)
        except TrainerLost as lost:
            rebuilds.take(lost.steps_trained)
            rebuilds.record(cfg.run.run_dir, lost)
            print(rebuilds.announcement(lost), flush=True)


async def _incarnation(cfg: TurnkeepConfig, max_steps: int | None, rebuilds: TrainerRebuilds) -> RunSummary:
    """One incarnation of the run: it restores when the run directory holds one, and trains until `max_steps`. A
    trainer death that `rebuilds` permits ends it with `TrainerLost`, leaving the rest of the run's processes up."""
    run_dir = cfg.run.run_dir
    identity = open_run_dir(cfg)
    audit = _open_audit(run_dir, identity)
    started = time.monotonic()
    clock = StartupClock()
    clock.mark("run_started")
    kept = KeptForRebuild()
    async with AsyncExitStack() as stack:
        stack.push_async_callback(audit.close)
        beating = asyncio.create_task(heartbeat.beat_forever(heartbeat.beat_file(run_dir, "controller")))
        stack.push_async_callback(_cancelled, beating)
        head, temporal_address, temporal_supervisor = await _start_ray_and_temporal(cfg, stack, identity, clock, kept)
        progress: dict = {}
        processes = await _start_processes(cfg, stack, identity, head, clock, RebuildTerms(rebuilds, kept, progress))
        session = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None))
        )
        controller, reported = await _start_controller(cfg, stack, identity, processes, session, audit, max_steps,
                                                       progress)
        keeper = engine_keeper(processes, run_dir=run_dir, no_engine_stop_s=cfg.policy.no_engine_stop_s,
                               restart_pause_s=cfg.policy.engine_restart_s, hang_s=cfg.policy.hang_s)
        snapshots = await _start_snapshots(cfg, stack, identity, controller, session, temporal_address, reported,
                                           keeper)
        clock.mark("recovered" if identity.resumed else "workflows")
        clock.record(run_dir, identity.incarnation)
        observers = start_observers(stack, cfg, controller, processes, run_dir, identity)
        preemption = PreemptionHandler(controller, snapshots, cfg.snapshot.preemption_grace_s)
        preemption.install()
        keep_engines(keeper, processes, session)  # `turnkeep scale` reaches it through the run workflow's update
        stack.push_async_callback(keeper.stop)  # before the processes stop: their stopping is no death to repair
        died = await _train(controller, processes, keeper, snapshots, temporal_supervisor, preemption, max_steps)
        await _wind_down(cfg, controller, processes, snapshots, observers, died)
        if preemption.saved is not None:
            preemption.exit_soon(controller.training.step)
        return RunSummary(
            controller.training.step, time.monotonic() - started, run_dir, controller.last_metrics,
            controller.metrics.peak_rss_mib, preempted=preemption.saved if controller.stop_reason else None,
            steps_trained=controller.metrics.steps_trained,
        )


def _open_audit(run_dir: Path, identity: RunIdentity) -> AuditLog:
    """The controller's pid file and the incarnation's audit log, its first line written."""
    if identity.resumed:
        print(f"turnkeep: resuming run {identity.run_id} in {run_dir} (incarnation {identity.incarnation})",
              flush=True)
    # A beat first: a keeper that finds this pid must not read the previous controller's last, old beat.
    heartbeat.beat(heartbeat.beat_file(run_dir, "controller"))
    write_pid_file(run_dir, "controller", os.getpid())
    audit = AuditLog(run_dir / AUDIT_FILE, identity.incarnation)
    audit.emit(RunStarted, run_id=identity.run_id, pid=os.getpid(), resumed=identity.resumed)
    audit.start()
    return audit


async def _start_ray_and_temporal(
    cfg: TurnkeepConfig, stack: AsyncExitStack, identity: RunIdentity, clock: StartupClock, kept: KeptForRebuild,
) -> tuple[RayHead | None, str | None, TemporalSupervisor | None]:
    """The run's Ray head (None: Ray inside this process), Temporal's address and the embedded server's
    supervisor (`_start_temporal`)."""
    # The embedded Temporal server boots in its own process while Ray starts (both take seconds on a restart).
    temporal_start = asyncio.create_task(_start_temporal(cfg, stack, kept), name="temporal-start")
    await asyncio.sleep(0)  # runs until it waits for the spawned server to answer
    try:
        head = join_ray(cfg, cfg.run.run_dir, ray_namespace(identity.run_id))
        clock.mark("ray")
    finally:
        temporal_address, temporal_supervisor = await marked(clock, "temporal", temporal_start)
    if head is not None:
        stack.callback(kept.unless, stop_head, head)  # after the processes' own stop (last in, first out)
        # Disconnect before the head goes: a driver left connected waits a minute for its GCS, then aborts the
        # process before the error that ended the run is printed.
        stack.callback(ray.shutdown)
    return head, temporal_address, temporal_supervisor


async def _start_processes(cfg: TurnkeepConfig, stack: AsyncExitStack, identity: RunIdentity, head: RayHead | None,
                           clock: StartupClock, terms: RebuildTerms) -> Processes:
    """The run's processes, stopped on the way out unless a trainer rebuild keeps them; on a user's cluster, the
    warden's heartbeat too."""
    on_cluster = bool(cfg.ray.address) and cfg.ray.survive_controller_s > 0
    survives = head is not None or on_cluster
    try:
        processes = await _processes(cfg, identity, head, clock)
    except TrainerDiedAtStart as died_at_start:
        lose_trainer(died_at_start.reason, 0, terms.rebuilds, terms.kept, survives)
    stack.push_async_callback(terms.kept.unless_async, shutdown, processes, on_cluster)
    # Unwinds before the shutdown above: a trainer found dead however the incarnation ended (a restore into it
    # failed, a pump's call to it) is rebuilt, the rest of the run's processes kept for the next incarnation.
    stack.push_async_exit(lambda kind, err, tb: rebuild_on_trainer_death(err, processes, terms, survives))
    if on_cluster:
        beating = asyncio.create_task(beat_forever(cfg.ray.survive_controller_s, cfg.run.run_dir,
                                                   cfg.ray.controller_hang_s), name="warden-beat")
        stack.push_async_callback(_cancelled, beating)  # before the shutdown, which stops the warden
    return processes


async def _start_controller(
    cfg: TurnkeepConfig, stack: AsyncExitStack, identity: RunIdentity, processes: Processes,
    session: aiohttp.ClientSession, audit: AuditLog, max_steps: int | None, progress: dict,
) -> tuple[Controller, list[Capabilities]]:
    """The controller, with the remote environment servers attached, and what every server reported of itself."""
    await attach_remote_servers(cfg, processes, session, identity.run_id, identity.incarnation)
    servers = ", ".join(f"{ep.name} {ep.url} ({', '.join(ep.environments)})" for ep in processes.env_servers)
    engines = ", ".join(engine.url for engine in processes.engines.all())
    log.info("policy engines %s, environment servers: %s; model %s", engines, servers,
             processes.model_dir)
    reported = await _server_capabilities(cfg, processes, session)
    controller = progress["controller"] = Controller(
        cfg, processes, session, max_steps, audit=audit,
        checkpoint_identity=CheckpointIdentity(identity.run_id, fingerprint_fields(cfg)),
        prompts=prompt_source(cfg), level_plans=_recovery_plans(cfg, reported), eval_problems=run_eval_problems(cfg),
    )
    stack.push_async_callback(controller.env_client.close)
    stack.callback(lambda: controller.data_plane.journal.close())
    if not identity.resumed:
        controller.start_journal(identity.run_id, identity.incarnation)
    return controller, reported


async def _start_snapshots(
    cfg: TurnkeepConfig, stack: AsyncExitStack, identity: RunIdentity, controller: Controller,
    session: aiohttp.ClientSession, temporal_address: str | None, reported: list[Capabilities], keeper: EngineKeeper,
) -> SnapshotRuntime | None:
    """The restore of a resumed run, and the workers and run workflow (None: snapshots are off, and a resumed run
    is restored here without Temporal)."""
    recovery = _recovery(cfg, controller, identity, session) if identity.resumed else None
    if temporal_address is None:
        if recovery is not None:
            _report_recovery(cfg.run.run_dir, identity, await _recover_without_temporal(recovery))
        return None
    snapshots = await start_snapshots(cfg, controller, session, temporal_address, identity.run_id,
                                      identity.incarnation, recovery, agents_mode=_agents_mode(cfg, reported),
                                      engine_keeper=keeper)
    stack.push_async_callback(stop_snapshots, snapshots, "training finished", cfg.snapshot.phase_timeout_s)
    if snapshots.recovery is not None:
        _report_recovery(cfg.run.run_dir, identity, snapshots.recovery)
    return snapshots


async def _train(controller: Controller, processes: Processes, keeper: EngineKeeper,
                 snapshots: SnapshotRuntime | None, temporal_supervisor: TemporalSupervisor | None,
                 preemption: PreemptionHandler, max_steps: int | None) -> list[str]:
    """Run the pumps until `max_steps` or a stop reason; the deaths that stopped the run."""
    died: list[str] = []
    trainer_death = asyncio.ensure_future(first_death({"trainer": processes.trainer}))
    deaths = _noted(first_of(trainer_death, keeper.none_live()), died)
    try:
        watch = snapshots.watch() if snapshots is not None else None
        temporal_lost = temporal_supervisor.lost() if temporal_supervisor is not None else None
        await controller.run(max_steps, first_of(watch, deaths, temporal_lost))
    except RunStopped as stopped:
        if trainer_death.done() and not trainer_death.cancelled():
            # An attempt in flight cannot finish without the trainer: a short grace, then the rebuild.
            await stop_snapshots(snapshots, str(stopped), STOP_GRACE_AFTER_DEATH_S)
        raise
    finally:
        preemption.uninstall()
    return died


async def _wind_down(cfg: TurnkeepConfig, controller: Controller, processes: Processes,
                     snapshots: SnapshotRuntime | None, observers: RunObservers, died: list[str]) -> None:
    """After a run that stopped on its own: the run workflow, the last hold sample, the audit log's end."""
    if snapshots is not None:
        # An attempt in flight cannot finish without the process that died: waiting the full phase timeout
        # for it would only delay the one-line stop.
        grace_s = STOP_GRACE_AFTER_DEATH_S if died else cfg.snapshot.phase_timeout_s
        await stop_snapshots(snapshots, controller.stop_reason or "training finished", grace_s)
    await controller.training.release_preemption_hold()  # a preemption's hold on the step it abandoned
    await observers.last_sample()
    await _audit_end(controller, processes, controller.stop_reason or "finished")
    controller.metrics.finish()


async def _cancelled(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _noted(watch, noted: list[str]) -> str:
    reason = await watch
    noted.append(reason)
    return reason


async def _processes(cfg: TurnkeepConfig, identity: RunIdentity, head: RayHead | None,
                     clock: StartupClock) -> Processes:
    """The trainer, the policy server and the environment server: re-attached when a crashed controller of this run
    left them running in its Ray, started otherwise."""
    survives = cfg.ray.survive_controller_s > 0
    if head is None and not (cfg.ray.address and survives):
        return await launch(cfg, identity.incarnation, reserve_gpus(cfg), clock=clock)
    stamp = {"run_id": identity.run_id, "digest": process_digest(cfg)}
    # On a user's cluster anything this run left is found in its namespace; the run's own head says so itself.
    if head is None or head.reused:
        began = time.monotonic()
        restorable = identity.resumed and has_trainer_checkpoint(cfg.run.run_dir)
        survivors = await reattach(cfg, stamp, identity.incarnation, restorable)
        if survivors is not None:
            what = ("started a new trainer beside the policy server and the environment server" if survivors.new_trainer
                    else "re-attached the trainer, the policy server and the environment server")
            print(f"turnkeep: {what} an earlier controller left running ({time.monotonic() - began:.1f}s)",
                  flush=True)
            clock.mark("reattached")
            return survivors
    return await launch(cfg, identity.incarnation, reserve_gpus(cfg, detached=True), identity=stamp, clock=clock)


async def _server_capabilities(cfg: TurnkeepConfig, processes, session) -> list[Capabilities]:
    environments, _ = participant_clients(processes, session, cfg.snapshot.phase_timeout_s)
    return [await env.capabilities() for env in environments]


def _warn(warning: str) -> None:
    log.warning("%s", warning)
    print(f"turnkeep: warning: {warning}", file=sys.stderr, flush=True)


def _agents_mode(cfg: TurnkeepConfig, servers: list[Capabilities]) -> AgentsMode:
    """`snapshot.agents` resolved against the servers; one warning when `auto` has to park."""
    mode, warning = resolve_agents_mode(cfg.snapshot.agents, cfg.env.journal_turns, servers)
    if warning is not None:
        _warn(warning)
    log.info("snapshots keep the running agents: %s (snapshot.agents = %s)", mode, cfg.snapshot.agents)
    return mode


def _recovery_plans(cfg: TurnkeepConfig, servers: list[Capabilities]) -> dict[str, RolloutLevelPlan]:
    """Each environment's recovery level, lowered from what its server reports; one warning per lowered one."""
    plans, warnings = plan_levels(cfg, [caps for server in servers for caps in server.environments])
    if (unjournaled := unjournaled_turns_warning(cfg, servers, plans)) is not None:
        warnings.append(unjournaled)
    for warning in warnings:
        _warn(warning)
    levels = ", ".join(f"{p.name}={p.level}{' (group-scored)' if p.group_scored else ''}" for p in plans.values())
    log.info("recovery levels: %s", levels)
    return plans


def _recovery(cfg: TurnkeepConfig, controller: Controller, identity: RunIdentity, session) -> CrashRestore:
    environments, _ = participant_clients(controller.processes, session, cfg.snapshot.phase_timeout_s)
    return CrashRestore(cfg, controller, identity, environments)


async def _recover_without_temporal(recovery: CrashRestore) -> RecoveryResult:
    began = time.monotonic()
    source = recovery.choose()
    restored = await recovery.restore(source)
    if source.kind is not SourceKind.FRESH or restored.policy_version > 0:
        await recovery.load_policy_weights(restored.policy_version)
    await recovery.resume()
    return RecoveryResult(source=source, restore=restored, cancelled=[],
                          seconds={"total": round(time.monotonic() - began, 3)})


def _report_recovery(run_dir: Path, identity: RunIdentity, result: RecoveryResult) -> None:
    source, restored = result.source, result.restore
    kept = (f"; the trainer was kept at step {restored.step}, no step undone"
            if restored is not None and restored.step != source.step else "")
    print(f"turnkeep: restored from {source.kind} (step {source.step}): {source.reason}{kept}", flush=True)
    line = {"kind": MetricsKind.RECOVERY, "incarnation": identity.incarnation, **result.model_dump(mode="json")}
    append_jsonl(run_dir / "metrics.jsonl", line, durable=True)
    if restored is not None:
        log.info("restore: %d rows, %d agents continue from their saved turn, %d siblings start over; %d journal "
                 "records kept after the cut, undone steps %s train again first", restored.data_plane_rows,
                 restored.continuations, restored.restarted_siblings, restored.kept_after_cut_records,
                 restored.undone_steps)


async def _audit_end(controller: Controller, processes, reason: str) -> None:
    trainer_holders = await processes.trainer.hold_holders.remote()
    controller.audit.emit(
        RunEnded, step=controller.training.step, reason=reason,
        outstanding_groups=controller.ledger.group_ids(),
        admission_holders=sorted(controller.admission.holders()),
        deadline_holders=sorted(controller.deadline_holds.holders()), trainer_holders=trainer_holders,
    )
    controller.audit.flush()


async def _start_temporal(cfg: TurnkeepConfig, stack: AsyncExitStack,
                          kept: KeptForRebuild) -> tuple[str | None, TemporalSupervisor | None]:
    """The Temporal address (None with snapshots off) and, for the embedded server, its supervisor."""
    if not cfg.snapshot.enabled:
        return None, None
    if cfg.temporal.address is not None:
        return cfg.temporal.address, None
    endpoint = await start_dev_server(cfg.temporal, cfg.run.run_dir)
    stack.callback(kept.unless, stop_dev_server, endpoint)
    supervisor = TemporalSupervisor(endpoint, hang_s=cfg.temporal.hang_s)
    supervisor.start()
    stack.push_async_callback(supervisor.stop)  # first on the way out: the server's stop is no death
    taken_over = f", pid {endpoint.pid}, taken over from the previous controller" if endpoint.reused else ""
    print(f"turnkeep: Temporal UI at {endpoint.ui_url} (server {endpoint.address}{taken_over})", flush=True)
    return endpoint.address, supervisor
