"""Runs the real controller (pumps, data plane, ledgers) against the session's real
processes and Temporal server, with snapshot attempts, for a few steps."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from controller.errors import RunStopped
from controller.runtime import Controller
from schemas.config import TurnkeepConfig
from schemas.participant import FaultPlan
from tests.controller_inputs import controller_inputs
from workers.temporal.controller_worker import SnapshotRuntime, participant_clients, start_snapshots, stop_snapshots

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
        start = await stack.trainer.version.remote()
        max_steps = None if steps is None else start + steps
        controller = Controller(cfg, stack, session, max_steps, **controller_inputs(cfg))
        controller.training.continue_from(start, policy_version=start)  # the shared trainer: one version per step
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


def published_dirs(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.glob("checkpoints/step_*/snapshots/*") if not p.name.startswith("."))


def staging_dirs(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("checkpoints/step_*/snapshots/.staging-*"))
