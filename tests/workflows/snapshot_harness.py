"""Runs the real controller (pumps, data plane, ledgers) against the session's real
processes and Temporal server, with snapshot attempts, for a few steps."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.controller_inputs import controller_inputs
from turnkeep.controller.errors import RunStopped
from turnkeep.controller.runtime import Controller
from turnkeep.schemas import search_attributes as sa
from turnkeep.schemas.attempt_steps import (
    CUT,
    DISCARD_STAGING,
    GYM_ABORT,
    GYM_COMMIT,
    GYM_PREPARE,
    GYM_RESUME,
    OPEN_STAGING,
    POLICY_ABORT,
    POLICY_COMMIT,
    POLICY_PREPARE,
    POLICY_RESUME,
    PREFLIGHT,
    PUBLISH,
    CutInput,
    CutResult,
    DiscardStagingInput,
    GymCommitResult,
    GymInput,
    GymPrepareResult,
    GymReleaseResult,
    PolicyPrepareResult,
    PreflightInput,
    PreflightResult,
    PublishInput,
    PublishResult,
    StagingInput,
    StagingResult,
)
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.names import policy_queue
from turnkeep.schemas.participant import Artifact, FaultPlan
from turnkeep.schemas.snapshot import SnapshotAttemptInput, SnapshotAttemptResult, SnapshotTimeouts
from turnkeep.workers.temporal.controller_worker import (
    SnapshotRuntime,
    participant_clients,
    start_snapshots,
    stop_snapshots,
)
from turnkeep.workers.temporal.dev_server import UNTHROTTLED, temporal_binary
from turnkeep.workflows.snapshot_attempt import SnapshotAttemptWorkflow

HISTORY_DIR = Path(__file__).parent / "histories"


@dataclass
class ScenarioResult:
    controller: Controller
    snapshot_lines: list[dict]
    step_lines: list[dict]
    run_dir: Path
    trainer_holders: list[str]
    env_health: dict


def scenario_config(base: TurnkeepConfig, rollout: dict | None = None, **snapshot) -> TurnkeepConfig:
    run_dir = Path(tempfile.mkdtemp(prefix="tk-snap-", dir="/tmp"))
    data = base.model_dump(mode="json")
    data["run"]["run_dir"] = str(run_dir)
    # Parked unless a test asks for journal snapshots: most scenarios here are about the Gym phase's parking.
    data["snapshot"] = {"attempt_interval_s": 3600, "prepare_timeout_s": 30, "phase_timeout_s": 20, "lease_s": 15,
                        "agents": "parked", **snapshot}
    data["train"]["save_period"] = 2
    data["rollout"].update(rollout or {})
    return TurnkeepConfig.model_validate(data)


SCENARIO_DONE = "scenario finished"


async def run_scenario(
    stack, address: str, cfg: TurnkeepConfig, steps: int | None,
    env_faults: FaultPlan | None = None, policy_faults: FaultPlan | None = None,
    during: Callable[[SnapshotRuntime, Controller], Awaitable[None]] | None = None,
) -> ScenarioResult:
    run_id = f"test-{uuid.uuid4().hex[:6]}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        # Each scenario is a new controller of the shared trainer, and fences it as one does: an earlier scenario's
        # attempt cancelled at its stop may have left a holder (with its lease) and a step waiting on it.
        await stack.trainer.fence.remote()
        start = await stack.trainer.version.remote()
        max_steps = None if steps is None else start + steps
        controller = Controller(cfg, stack, session, max_steps, **controller_inputs(cfg))
        controller.training.continue_from(start, policy_version=start)  # the shared trainer: one version per step
        # The engine serves the trainer's version, as a run's start or restore makes it: an earlier scenario stopped
        # between a step and its refit left it behind, and every turn it generated was then too stale to train, so
        # the scenario never trained a step (seen once in CI: 10 minutes of discarded groups).
        await controller.load_policy_weights(start)
        controller.start_journal(run_id, 1)  # as a run's start does, fresh or restored
        (env,), policy = participant_clients(stack, session, 30)
        await env.set_faults(env_faults or FaultPlan())
        await policy.set_faults(policy_faults or FaultPlan())
        snapshots = await start_snapshots(cfg, controller, session, address, run_id, incarnation=1,
                                          agents_mode=cfg.snapshot.agents)
        try:
            side = asyncio.ensure_future(during(snapshots, controller)) if during else None
            if steps is None:
                # Train until `during` is done with the run.
                await _run_until(controller, side, snapshots)
            else:
                await controller.run(max_steps, snapshots.watch())
            if side is not None:
                await side
        finally:
            await stop_snapshots(snapshots, "test finished", 60)
            await env.set_faults(FaultPlan())
            await policy.set_faults(FaultPlan())
        if os.environ.get("TURNKEEP_RECORD_HISTORIES"):
            await record_histories(snapshots, run_id)
        [run_env_server] = controller.env_client.links  # the run's own environment server's counters and holders
        env_health = await run_env_server.client.health()
        holders = await stack.trainer.hold_holders.remote()
    lines = [orjson.loads(line) for line in (cfg.run.run_dir / "metrics.jsonl").read_bytes().splitlines()]
    return ScenarioResult(
        controller=controller,
        snapshot_lines=[line for line in lines if line["kind"] == "snapshot"],
        step_lines=[line for line in lines if line["kind"] == "train_step"],
        run_dir=cfg.run.run_dir,
        trainer_holders=holders,
        env_health=env_health,
    )


async def _run_until(controller: Controller, side: asyncio.Future, snapshots: SnapshotRuntime) -> None:
    async def stop_when_done() -> str:
        watch = asyncio.ensure_future(snapshots.watch())
        done, _ = await asyncio.wait({side, watch}, return_when=asyncio.FIRST_COMPLETED)
        if side in done:
            watch.cancel()
            side.result()
            return SCENARIO_DONE
        return watch.result()

    try:
        await controller.run(None, stop_when_done())
    except RunStopped as stopped:
        if str(stopped) != SCENARIO_DONE:
            raise


async def record_histories(snapshots: SnapshotRuntime, run_id: str) -> None:
    """Keep this run's workflow histories for the replay test (TURNKEEP_RECORD_HISTORIES=1)."""
    HISTORY_DIR.mkdir(exist_ok=True)
    async for execution in snapshots.client.list_workflows(f"TurnkeepRunId = '{run_id}'"):
        history = await snapshots.client.get_workflow_handle(execution.id).fetch_history()
        (HISTORY_DIR / f"{execution.workflow_type}-{execution.id}.json").write_text(history.to_json())


async def query_once_started(handle: WorkflowHandle, query: str):
    """The query's answer, or None while the workflow does not exist yet: the run workflow names its running attempt
    before the server has started that child, and a query then fails with "workflow not found"."""
    try:
        return await handle.query(query)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


def published_dirs(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.glob("checkpoints/step_*/snapshots/*") if not p.name.startswith("."))


def staging_dirs(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("checkpoints/step_*/snapshots/.staging-*"))


# -- one attempt against stand-in participants (no stack) ------------------------------------------------------------


class StandInParticipants:
    """Every step a parked attempt without a trainer hold calls, answering at once. Each call is recorded with the
    queue it ran on; a policy step answers as the engine of its queue."""

    def __init__(self, policy_versions: dict[int, int] | None = None, prepare_s: float = 0.0):
        self.calls: list[tuple[str, str]] = []
        """(step, task queue), in the order they started."""
        self.policy_versions = policy_versions or {}
        """The policy version an engine's commit reports, by engine index (default 7)."""
        self.prepare_s = prepare_s
        """How long each engine's policy.prepare takes."""
        self.published: PublishInput | None = None

    def _called(self) -> str:
        info = activity.info()
        self.calls.append((info.activity_type, info.task_queue))
        return info.task_queue

    @activity.defn(name=PREFLIGHT)
    async def preflight(self, inp: PreflightInput) -> PreflightResult:
        self._called()
        return PreflightResult(skip_reason=None)

    @activity.defn(name=OPEN_STAGING)
    async def open_staging(self, inp: StagingInput) -> StagingResult:
        self._called()
        return StagingResult(staging_dir="/nowhere/.staging")

    @activity.defn(name=GYM_PREPARE)
    async def gym_prepare(self, inp: GymInput) -> GymPrepareResult:
        self._called()
        return GymPrepareResult(participant_s=0.1)

    @activity.defn(name=GYM_COMMIT)
    async def gym_commit(self, inp: GymInput) -> GymCommitResult:
        self._called()
        return GymCommitResult(participant_s=0.1, artifacts=[_artifact("env/agents.jsonl")],
                               counts={"parked_agents": 2})

    @activity.defn(name=GYM_RESUME)
    async def gym_resume(self, inp: GymInput) -> GymReleaseResult:
        self._called()
        return GymReleaseResult(participant_s=0.1, admission_closed_s=1.0)

    @activity.defn(name=GYM_ABORT)
    async def gym_abort(self, inp: GymInput) -> GymReleaseResult:
        self._called()
        return GymReleaseResult(participant_s=0.1, admission_closed_s=1.0)

    @activity.defn(name=CUT)
    async def cut(self, inp: CutInput) -> CutResult:
        self._called()
        return CutResult(artifacts=[], data_plane_rows=3, unfinished_groups=0, continuations=0, policy_version=7)

    @activity.defn(name=PUBLISH)
    async def publish(self, inp: PublishInput) -> PublishResult:
        self._called()
        self.published = inp
        return PublishResult(snapshot_dir=f"snapshots/{inp.number}", bytes_written=1)

    @activity.defn(name=DISCARD_STAGING)
    async def discard_staging(self, inp: DiscardStagingInput) -> None:
        self._called()

    @activity.defn(name=POLICY_PREPARE)
    async def policy_prepare(self, inp: GymInput) -> PolicyPrepareResult:
        self._called()
        await asyncio.sleep(self.prepare_s)
        return PolicyPrepareResult(participant_s=0.1, drained=1)

    @activity.defn(name=POLICY_COMMIT)
    async def policy_commit(self, inp: GymInput) -> GymCommitResult:
        queue = self._called()
        engine = queue.rsplit(".", 1)[-1]  # `<run_id>.policy.<k>`, or `<run_id>.policy` before engines
        version = self.policy_versions.get(int(engine), 7) if engine.isdigit() else 7
        return GymCommitResult(participant_s=0.1, artifacts=[_artifact(f"{queue}/state.json")],
                               counts={"policy_version": version})

    @activity.defn(name=POLICY_RESUME)
    async def policy_resume(self, inp: GymInput) -> GymReleaseResult:
        self._called()
        return GymReleaseResult(participant_s=0.1, admission_closed_s=0.0)

    @activity.defn(name=POLICY_ABORT)
    async def policy_abort(self, inp: GymInput) -> GymReleaseResult:
        self._called()
        return GymReleaseResult(participant_s=0.1, admission_closed_s=0.0)

    def controller_activities(self) -> list:
        return [self.preflight, self.open_staging, self.gym_prepare, self.gym_commit, self.gym_resume,
                self.gym_abort, self.cut, self.publish, self.discard_staging]

    def policy_activities(self) -> list:
        return [self.policy_prepare, self.policy_commit, self.policy_resume, self.policy_abort]

    def policy_calls(self, step: str) -> list[str]:
        """The queues `step` ran on, sorted."""
        return sorted(queue for name, queue in self.calls if name == step)


def _artifact(path: str) -> Artifact:
    return Artifact(path=path, sha256="0" * 64, bytes=1)


async def attempt_with_stand_ins(participants: StandInParticipants,
                                 engines: list[int] | None) -> SnapshotAttemptResult:
    """One parked attempt on a dev server of its own: the controller's worker serves the workflow and the
    controller's steps; the old policy server's queue and engines 0 and 1 each have a worker."""
    async with _stand_in_workers(participants) as (client, run_id, _):
        return await client.execute_workflow(SnapshotAttemptWorkflow.run, _attempt_input(run_id, engines),
                                             id=f"{run_id}.snapshot.4.1", task_queue=f"{run_id}.controller")


async def attempt_dropped_by_its_worker(participants: StandInParticipants, engines: list[int] | None,
                                        step: str) -> None:
    """An attempt whose controller worker shuts down while every engine runs `step`: the worker drops the workflow
    instance mid-activity, and the garbage collector closes its coroutines later, outside any workflow event loop."""
    async with _stand_in_workers(participants) as (client, run_id, controller):
        await client.start_workflow(SnapshotAttemptWorkflow.run, _attempt_input(run_id, engines),
                                    id=f"{run_id}.snapshot.4.1", task_queue=f"{run_id}.controller")
        while len(participants.policy_calls(step)) < len(engines or [None]):
            await asyncio.sleep(0.05)
        await controller.shutdown()


@asynccontextmanager
async def _stand_in_workers(participants: StandInParticipants):
    """(client, run id, the controller's worker), the workers running."""
    run_id = f"fake-{uuid.uuid4().hex[:6]}"
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), data_converter=pydantic_data_converter, search_attributes=sa.ALL,
        dev_server_extra_args=[arg for value in UNTHROTTLED for arg in ("--dynamic-config-value", value)],
    ) as env:
        queues = [policy_queue(run_id, engine) for engine in (None, 0, 1)]
        policy_workers = [Worker(env.client, task_queue=queue, activities=participants.policy_activities())
                          for queue in queues]
        controller = Worker(env.client, task_queue=f"{run_id}.controller", workflows=[SnapshotAttemptWorkflow],
                            activities=participants.controller_activities())
        async with controller, policy_workers[0], policy_workers[1], policy_workers[2]:
            yield env.client, run_id, controller


def _attempt_input(run_id: str, engines: list[int] | None) -> SnapshotAttemptInput:
    return SnapshotAttemptInput(
        run_id=run_id, checkpoint_id=f"{run_id}.snapshot.4.1", number=1, trigger="operator", anchor_step=4,
        incarnation=1, trainer_hold=False, engines=engines,
        timeouts=SnapshotTimeouts(prepare_s=10, phase_s=10, lease_s=10))
