"""Connect a running controller to Temporal: the workers, the run workflow, and the hook
that ties an attempt to every trainer checkpoint."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.worker import Worker

from activities.gym_activities import GymActivities
from activities.participant_client import ParticipantClient
from activities.snapshot_activities import SnapshotActivities
from activities.snapshot_context import SnapshotContext
from controller.fingerprint import config_fingerprint
from controller.runtime import Controller
from controller.temporal_server import register_search_attributes
from schemas import search_attributes as sa
from schemas.config import TurnkeepConfig
from schemas.snapshot import RunWorkflowInput, SnapshotTimeouts, TrainerCheckpointSignal, Trigger
from workers.temporal_workers import connect, controller_queue, start_worker
from workflows.run_workflow import RunWorkflow
from workflows.snapshot_attempt import SnapshotAttemptWorkflow

log = logging.getLogger("turnkeep.snapshot")


@dataclass
class SnapshotRuntime:
    client: Client
    worker: Worker
    worker_task: asyncio.Task
    handle: WorkflowHandle
    ctx: SnapshotContext

    async def watch(self) -> str:
        """Resolves when the run workflow ends on its own (it stops the run)."""
        result = await self.handle.result()
        return result.stopped_reason


def timeouts(cfg: TurnkeepConfig) -> SnapshotTimeouts:
    snap = cfg.snapshot
    return SnapshotTimeouts(prepare_s=snap.prepare_timeout_s, phase_s=snap.phase_timeout_s, lease_s=snap.lease_s)


def participant_clients(processes, session: aiohttp.ClientSession, timeout_s: float) -> tuple[list, ParticipantClient]:
    env = ParticipantClient("env", processes.env_url, processes.control_token, session, timeout_s)
    policy = ParticipantClient("policy", processes.policy_url, processes.control_token, session, timeout_s)
    return [env], policy


def controller_worker(client: Client, ctx: SnapshotContext) -> tuple[Worker, asyncio.Task]:
    """The workflows and the controller's activities on `<run_id>.controller`."""
    gym, snap = GymActivities(ctx), SnapshotActivities(ctx)
    return start_worker(
        client, controller_queue(ctx.run_id),
        activities=[gym.prepare, gym.commit, gym.resume, gym.abort, snap.anchor, snap.request_checkpoint,
                    snap.preflight, snap.open_staging,
                    snap.discard_staging, snap.cut, snap.publish, snap.record],
        workflows=[RunWorkflow, SnapshotAttemptWorkflow],
    )


async def start_snapshots(
    cfg: TurnkeepConfig, controller: Controller, session: aiohttp.ClientSession, address: str, run_id: str,
    incarnation: int,
) -> SnapshotRuntime:
    processes = controller.processes
    client = await connect(address, cfg.temporal.namespace)
    if cfg.temporal.address is not None:
        await register_search_attributes(client, cfg.temporal.namespace)
    await processes.trainer.start_temporal_worker.remote(address, cfg.temporal.namespace, run_id)
    environments, policy = participant_clients(processes, session, cfg.snapshot.phase_timeout_s)
    ctx = SnapshotContext(
        run_id=run_id, incarnation=incarnation, run_dir=cfg.run.run_dir, fingerprint=config_fingerprint(cfg),
        controller=controller, trainer=processes.trainer, environments=environments, policy=policy,
        interval_s=cfg.snapshot.attempt_interval_s,
    )
    worker, worker_task = controller_worker(client, ctx)
    handle = await client.start_workflow(
        RunWorkflow.run,
        RunWorkflowInput(
            run_id=run_id, incarnation=incarnation, attempt_interval_s=cfg.snapshot.attempt_interval_s,
            max_consecutive_failures=cfg.snapshot.max_consecutive_failures, keep_latest_k=cfg.snapshot.keep_latest_k,
            trainer_hold=cfg.snapshot.trainer_hold, checkpoint_on_demand=cfg.snapshot.checkpoint_on_demand,
            timeouts=timeouts(cfg),
        ),
        id=f"{run_id}.run", task_queue=controller_queue(run_id),
        static_summary=f"turnkeep run {run_id} ({cfg.run.run_dir})",
        search_attributes=TypedSearchAttributes([SearchAttributePair(sa.RUN_ID, run_id)]),
    )
    runtime = SnapshotRuntime(client, worker, worker_task, handle, ctx)
    controller.after_checkpoint = lambda step, trigger: _tie_attempt_to_checkpoint(cfg, runtime, step, trigger)
    return runtime


async def _tie_attempt_to_checkpoint(cfg: TurnkeepConfig, runtime: SnapshotRuntime, step: int, trigger: str) -> None:
    """Hold the next optimizer step until the attempt for this checkpoint takes over the hold."""
    if cfg.snapshot.trainer_hold:
        await runtime.ctx.trainer.hold_add.remote(f"checkpoint:{step}", cfg.snapshot.lease_s)
    await runtime.handle.signal(
        RunWorkflow.trainer_checkpoint_saved, TrainerCheckpointSignal(step=step, trigger=Trigger(trigger))
    )


async def stop_snapshots(runtime: SnapshotRuntime | None, reason: str, grace_s: float) -> None:
    """Let a running attempt finish (or cancel it after `grace_s`), then stop the workers."""
    if runtime is None:
        return
    try:
        await runtime.handle.signal(RunWorkflow.stop, reason)
        await asyncio.wait_for(runtime.handle.result(), timeout=grace_s)
    except asyncio.TimeoutError:
        log.warning("the run workflow did not stop within %.0fs; cancelling it", grace_s)
        await runtime.handle.cancel()
    except Exception as err:  # noqa: BLE001 - it may already have ended with a failure
        log.info("run workflow ended: %s", err)
    await runtime.ctx.trainer.stop_temporal_worker.remote()
    await runtime.worker.shutdown()
