"""Connect a running controller to Temporal: the workers, the run workflow, and the hook
that ties an attempt to every trainer checkpoint."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import aiohttp
from ray.exceptions import RayActorError
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from turnkeep.activities.engine_activities import EngineActivities
from turnkeep.activities.env_server_activities import EnvServerActivities
from turnkeep.activities.eval_activities import EvalActivities
from turnkeep.activities.recovery_activities import RecoveryActivities
from turnkeep.activities.snapshot_activities import SnapshotActivities
from turnkeep.controller.engines.engine_keeper import EngineKeeper
from turnkeep.controller.engines.engine_pool import Engine
from turnkeep.controller.fingerprint import config_fingerprint
from turnkeep.controller.restore.crash_restore import CrashRestore
from turnkeep.controller.runtime import Controller
from turnkeep.controller.snapshot.coordinator import SnapshotCoordinator
from turnkeep.controller.snapshot.periodic_attempts import periodic_interval_s
from turnkeep.controller.stores.trainer_checkpoint import published_steps
from turnkeep.participants.client import ParticipantClient
from turnkeep.primitives import snapshot_paths
from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.primitives.temporal_client import connect, start_worker, step_activities
from turnkeep.schemas import search_attributes as sa
from turnkeep.schemas.choices import AgentsMode, MetricsKind, Trigger
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.names import (
    CHECKPOINT_HOLDER_PREFIX,
    checkpoint_holder,
    controller_queue,
    engine_name,
    recovery_workflow_id,
    run_workflow_id,
)
from turnkeep.schemas.recovery import RecoveryInput, RecoveryResult
from turnkeep.schemas.snapshot import RunCarryOver, RunWorkflowInput, SnapshotTimeouts, TrainerCheckpointSignal
from turnkeep.schemas.step_registry import declared_steps
from turnkeep.schemas.steps import Runs
from turnkeep.workers.temporal.dev_server import register_search_attributes
from turnkeep.workers.temporal.loop_bridge import BridgedRun, bridged_activities
from turnkeep.workers.temporal.workflow_thread import WorkflowThread
from turnkeep.workflows.recovery_workflow import RecoveryWorkflow
from turnkeep.workflows.retry_policies import WORKFLOW_TASK_TIMEOUT
from turnkeep.workflows.run_workflow import RunWorkflow
from turnkeep.workflows.snapshot_attempt import SnapshotAttemptWorkflow

T = TypeVar("T")
log = logging.getLogger("turnkeep.snapshot")


class RecoveryFailed(RuntimeError):
    """The recovery workflow failed (for example every checkpoint is unusable); the message says why."""


@dataclass
class SnapshotRuntime:
    client: Client
    worker: Worker
    worker_task: asyncio.Task
    handle: WorkflowHandle
    ctx: SnapshotCoordinator
    workflows: WorkflowThread
    recovery: RecoveryResult | None = None
    """The result of this incarnation's restore through the recovery workflow (None for a new run)."""
    stopped: bool = False

    async def watch(self) -> str:
        """Resolves when the run workflow ends on its own (it stops the run).

        A Temporal server that is away (restarting, a network blip) is waited for: the
        history is on its disk, and the workflow goes on when it is back.
        """
        return (await workflow_result(self.handle)).stopped_reason


async def workflow_result(handle: WorkflowHandle):
    """The workflow's result, waiting out a Temporal server that is away (restarting, a network blip)."""
    while True:
        try:
            return await handle.result()
        except RPCError as err:
            if not _temporal_away(err):
                raise
            log.warning("Temporal does not answer (%s); waiting for it, the run goes on", err)
            await asyncio.sleep(TEMPORAL_RETRY_S)


TEMPORAL_RETRY_S = 2.0
WORKER_SHUTDOWN_S = 30.0
TEMPORAL_SIGNAL_PATIENCE_S = 120.0


def _temporal_away(err: RPCError) -> bool:
    return err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNKNOWN)


async def signal_patiently(handle: WorkflowHandle, signal, arg, what: str) -> bool:
    """Send a signal, waiting out a Temporal that is away for up to a couple of minutes; False if it never came."""
    deadline = asyncio.get_running_loop().time() + TEMPORAL_SIGNAL_PATIENCE_S
    while True:
        try:
            await handle.signal(signal, arg)
            return True
        except RPCError as err:
            if not _temporal_away(err) or asyncio.get_running_loop().time() > deadline:
                log.warning("could not signal %s (%s); it is dropped", what, err)
                return False
            await asyncio.sleep(TEMPORAL_RETRY_S)


def timeouts(cfg: TurnkeepConfig) -> SnapshotTimeouts:
    snap = cfg.snapshot
    return SnapshotTimeouts(prepare_s=snap.prepare_timeout_s, phase_s=snap.phase_timeout_s, lease_s=snap.lease_s)


def participant_clients(processes, session: aiohttp.ClientSession, timeout_s: float) -> tuple[list, ParticipantClient]:
    """Every environment server (a remote one's files travel inside its calls), and the first live engine."""
    environments = [ParticipantClient(ep.name, ep.url, ep.token, session, timeout_s, inline_files=ep.remote)
                    for ep in processes.env_servers]
    first = processes.engines.first()
    policy = ParticipantClient(engine_name(first.index), first.url, processes.control_token, session, timeout_s)
    return environments, policy


CONTROLLER_WORKFLOWS = (RunWorkflow, SnapshotAttemptWorkflow, RecoveryWorkflow)


def controller_worker(
    client: Client, ctx: SnapshotCoordinator, recovery: RecoveryActivities | None = None,
    engine_keeper: EngineKeeper | None = None,
) -> tuple[Worker, asyncio.Task]:
    """The controller's activities on `<run_id>.controller`, on the controller's loop with the objects they change
    (the workflows run on `WorkflowThread`, on the same queue)."""
    extra = [] if recovery is None else step_activities(recovery, runs=CONTROLLER_STEPS)
    return start_worker(client, controller_queue(ctx.run_id),
                        activities=[*controller_activities(ctx, engine_keeper), *extra])


CONTROLLER_STEPS = (Runs.CONTROLLER, Runs.LOCAL)


def controller_activities(ctx: SnapshotCoordinator, engine_keeper: EngineKeeper | None = None) -> list:
    """Every attempt and run phase the controller itself carries out (scaling the engines goes to `engine_keeper`;
    None: it is refused)."""
    return step_activities(EnvServerActivities(ctx), SnapshotActivities(ctx), EngineActivities(ctx, engine_keeper),
                           EvalActivities(ctx), runs=CONTROLLER_STEPS)


def local_steps() -> list[str]:
    """The steps the controller's workflow worker runs as local activities."""
    return [name for name, step in declared_steps().items() if step.runs is Runs.LOCAL]


def record_local_runs(run_dir: Path) -> Callable[[BridgedRun], None]:
    """Each local activity's own clocks as a `local_activity` line in metrics.jsonl, for `turnkeep bench
    orchestration` (its marker in the history cannot be trusted for them under load)."""
    def record(run: BridgedRun) -> None:
        append_jsonl(run_dir / "metrics.jsonl", {"kind": MetricsKind.LOCAL_ACTIVITY, "t": round(time.time(), 3),
                                                 **{k: round(v, 6) if isinstance(v, float) else v
                                                    for k, v in asdict(run).items()}})
    return record


async def start_snapshots(
    cfg: TurnkeepConfig, controller: Controller, session: aiohttp.ClientSession, address: str, run_id: str,
    incarnation: int, recovery: CrashRestore | None = None, *, agents_mode: AgentsMode,
    engine_keeper: EngineKeeper | None = None,
) -> SnapshotRuntime:
    """Start the workers; with `recovery`, restore the run through the recovery workflow; then start the run workflow
    whose attempts keep the running agents as `agents_mode` says (`snapshot.agents` resolved at start), and connect
    it to the controller's checkpoint announcements. `engine_keeper`: what the run workflow's scaling goes to."""
    security = cfg.temporal.security() if cfg.temporal.address is not None else None
    client = await _client(cfg, address, security)
    # The trainer's and the engines' workers start (seconds: each process imports and connects) while the recovery
    # runs; a task for them waits in their queue until they poll.
    actor_workers = _start_actor_workers(cfg, controller.processes, address, run_id, incarnation, security)
    interval_s = periodic_interval_s(cfg.snapshot.attempt_interval_s, agents_mode)
    ctx = _coordinator(cfg, controller, session, run_id, incarnation, interval_s)
    recovery_acts = None
    if recovery is not None:
        recovery_acts = RecoveryActivities(client, recovery, incarnation, wait_s=cfg.snapshot.phase_timeout_s)
    local = bridged_activities(controller_activities(ctx, engine_keeper), local_steps(), asyncio.get_running_loop(),
                               record_local_runs(cfg.run.run_dir))
    workflows = WorkflowThread(address, cfg.temporal.namespace, security, controller_queue(run_id),
                               CONTROLLER_WORKFLOWS, local)
    worker: Worker | None = None
    try:
        await workflows.start()
        worker, worker_task = controller_worker(client, ctx, recovery_acts, engine_keeper)
        recovered = None
        if recovery is not None:
            recovered = await _unless_it_fails(actor_workers, _recover(cfg, client, run_id, incarnation,
                                                                       controller.processes.engines.indices()))
        await actor_workers
        handle = await _start_run_workflow(cfg, client, run_id, incarnation, interval_s, agents_mode,
                                           controller.processes.engines.indices())
    except BaseException:
        await _abandon_start(actor_workers, worker, workflows)
        raise
    runtime = SnapshotRuntime(client, worker, worker_task, handle, ctx, workflows, recovery=recovered)
    controller.checkpoint_announcements.connect(lambda step, trigger, repeat: _tie_attempt_to_checkpoint(
        cfg, runtime, step, trigger, repeat))
    return runtime


async def _client(cfg: TurnkeepConfig, address: str, security) -> Client:
    client = await connect(address, cfg.temporal.namespace, security)
    if cfg.temporal.address is not None:
        await register_search_attributes(client, cfg.temporal.namespace)
    return client


def _start_actor_workers(cfg: TurnkeepConfig, processes, address: str, run_id: str, incarnation: int,
                         security) -> asyncio.Future:
    """The trainer's and the live engines' Temporal workers, starting; an engine started later starts its own."""
    # The GPU-side processes run their own workers, so an attempt's history shows which process did what.
    async def engine_worker(engine: Engine) -> None:
        await engine.actor.start_temporal_worker.remote(address, cfg.temporal.namespace, run_id, incarnation,
                                                        security)

    actor_workers = asyncio.gather(
        processes.trainer.start_temporal_worker.remote(address, cfg.temporal.namespace, run_id, incarnation,
                                                       security),
        *(engine_worker(engine) for engine in processes.engines.live()))
    processes.engines.on_start.append(engine_worker)  # a replacement serves its queue before it goes live
    return actor_workers


def _coordinator(cfg: TurnkeepConfig, controller: Controller, session: aiohttp.ClientSession, run_id: str,
                 incarnation: int, interval_s: float | None) -> SnapshotCoordinator:
    environments, _policy = participant_clients(controller.processes, session, cfg.snapshot.phase_timeout_s)
    return SnapshotCoordinator(
        run_id=run_id, incarnation=incarnation, run_dir=cfg.run.run_dir, fingerprint=config_fingerprint(cfg),
        controller=controller, trainer=controller.processes.trainer, environments=environments,
        interval_s=interval_s,
    )


async def _start_run_workflow(cfg: TurnkeepConfig, client: Client, run_id: str, incarnation: int,
                              interval_s: float | None, agents_mode: AgentsMode, engines: list[int]) -> WorkflowHandle:
    return await client.start_workflow(
        RunWorkflow.run,
        RunWorkflowInput(
            run_id=run_id, incarnation=incarnation, attempt_interval_s=interval_s,
            max_consecutive_failures=cfg.snapshot.max_consecutive_failures, keep_latest_k=cfg.snapshot.keep_latest_k,
            trainer_hold=cfg.snapshot.trainer_hold, checkpoint_on_demand=cfg.snapshot.checkpoint_on_demand,
            agents=agents_mode, timeouts=timeouts(cfg),
            carried=RunCarryOver(numbers=next_snapshot_numbers(cfg.run.run_dir)),
            engines=engines,
        ),
        id=run_workflow_id(run_id), task_queue=controller_queue(run_id), task_timeout=WORKFLOW_TASK_TIMEOUT,
        static_summary=f"turnkeep run {run_id} ({cfg.run.run_dir})",
        search_attributes=TypedSearchAttributes([SearchAttributePair(sa.RUN_ID, run_id)]),
    )


async def _abandon_start(actor_workers: asyncio.Future, worker: Worker | None, workflows: WorkflowThread) -> None:
    """The run does not start: nothing may keep polling for it. An activity worker left running was cancelled only
    when the event loop closed, after the embedded Temporal server had stopped, and its shutdown then waited for that
    server forever (a trainer killed during the recovery: the process never exited)."""
    actor_workers.cancel()
    await asyncio.gather(actor_workers, return_exceptions=True)
    await stop_controller_workers(worker, workflows)


async def _unless_it_fails(beside: asyncio.Future, work: Awaitable[T]) -> T:
    """`work`'s result; `beside` failing first cancels `work` and raises its error instead."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task, beside}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and not beside.cancelled() and beside.exception() is not None:
            beside.result()
        return await task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _recover(cfg: TurnkeepConfig, client: Client, run_id: str, incarnation: int,
                   engines: list[int]) -> RecoveryResult:
    """Run the recovery workflow to its end; a failure stops the run with its reason."""
    recovery_id = recovery_workflow_id(run_id, incarnation)
    try:
        result = await client.execute_workflow(
            RecoveryWorkflow.run,
            RecoveryInput(run_id=run_id, incarnation=incarnation, phase_timeout_s=cfg.snapshot.phase_timeout_s,
                          engines=engines),
            id=recovery_id, task_queue=controller_queue(run_id), task_timeout=WORKFLOW_TASK_TIMEOUT,
            static_summary=f"recovery of {run_id}: incarnation {incarnation} continues the run",
            search_attributes=TypedSearchAttributes([SearchAttributePair(sa.RUN_ID, run_id)]),
        )
    except WorkflowFailureError as err:
        cause = err.cause
        while getattr(cause, "cause", None) is not None:
            cause = cause.cause
        raise RecoveryFailed(f"recovery {recovery_id} failed: {getattr(cause, 'message', None) or cause}") from None
    if result.superseded is not None:
        # Another controller started on this run directory meanwhile: it owns the run now.
        raise RecoveryFailed(f"recovery {recovery_id} was superseded: {result.superseded}")
    return result


def next_snapshot_numbers(run_dir: Path) -> dict[str, int]:
    """Attempt numbers continue after every folder already on disk, so a restarted run never reuses one."""
    numbers = {}
    for step in published_steps(run_dir):
        root = snapshot_paths.snapshots_root(run_dir, step)
        used = [int(p.name) for p in (root.iterdir() if root.exists() else []) if p.name.isdigit()]
        if used:
            numbers[str(step)] = max(used) + 1
    return numbers


async def _tie_attempt_to_checkpoint(
    cfg: TurnkeepConfig, runtime: SnapshotRuntime, step: int, trigger: str, repeat: bool
) -> None:
    """Hold the next optimizer step until the attempt for this checkpoint takes over the hold.

    A repeated announcement takes no hold: the run workflow may find the checkpoint's
    attempt already done, and a hold nobody takes over would stall training for a lease.
    """
    if cfg.snapshot.trainer_hold and not repeat:
        await runtime.ctx.trainer.hold_add.remote(checkpoint_holder(step), cfg.snapshot.lease_s)
    sent = await signal_patiently(
        runtime.handle, RunWorkflow.trainer_checkpoint_saved,
        TrainerCheckpointSignal(step=step, trigger=Trigger(trigger), repeat=repeat), f"checkpoint {step}'s attempt",
    )
    if not sent and cfg.snapshot.trainer_hold and not repeat:
        await runtime.ctx.trainer.hold_release.remote(checkpoint_holder(step))


async def stop_snapshots(runtime: SnapshotRuntime | None, reason: str, grace_s: float) -> None:
    """Let a running attempt finish (or cancel it after `grace_s`), then stop the workers."""
    if runtime is None or runtime.stopped:
        return
    runtime.stopped = True
    try:
        await runtime.handle.signal(RunWorkflow.stop, reason)  # the client retries a short outage by itself
        await asyncio.wait_for(workflow_result(runtime.handle), timeout=grace_s)
    except asyncio.TimeoutError:
        log.warning("the run workflow did not stop within %.0fs; cancelling it", grace_s)
        try:
            await runtime.handle.cancel()
        except RPCError as err:  # Temporal is away: the next start's recovery closes what this run left open
            log.warning("could not cancel the run workflow: %s", err)
    except Exception as err:  # noqa: BLE001 - it may already have ended with a failure
        log.info("run workflow ended: %s", err)
    try:
        # A checkpoint taken while the run workflow was stopping has no attempt to take over its hold.
        for holder in await runtime.ctx.trainer.hold_holders.remote():
            if holder.startswith(CHECKPOINT_HOLDER_PREFIX):
                await runtime.ctx.trainer.hold_release.remote(holder)
        await runtime.ctx.trainer.stop_temporal_worker.remote()
    except RayActorError as err:  # the trainer died alone: its holds and its worker went with it
        log.info("trainer gone while stopping: %s", str(err).splitlines()[0] if str(err) else err)
    for engine in runtime.ctx.controller.processes.engines.live():
        try:
            await engine.actor.stop_temporal_worker.remote()
        except RayActorError as err:
            log.info("engine %d gone while stopping: %s", engine.index, str(err).splitlines()[0] if str(err) else err)
    await stop_controller_workers(runtime.worker, runtime.workflows)


async def stop_controller_workers(worker: Worker | None, workflows: WorkflowThread) -> None:
    """Stop the controller's activity worker (None: not started) and its workflow thread, each within
    `WORKER_SHUTDOWN_S`."""
    stopping = [] if worker is None else [("activity worker", worker.shutdown())]
    for what, stop in (*stopping, ("workflow worker", workflows.stop())):
        try:
            await asyncio.wait_for(stop, WORKER_SHUTDOWN_S)
        except asyncio.TimeoutError:
            # Seen once: a shutdown waiting on a task that never ended kept a finished run from exiting.
            log.warning("the controller's Temporal %s did not stop within %.0fs; the run ends without it", what,
                        WORKER_SHUTDOWN_S)
