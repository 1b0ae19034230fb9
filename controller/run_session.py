"""One `turnkeep run`: start everything it needs, train until `steps`, stop everything.

Start order: run directory, Ray and the three processes, Temporal (the embedded dev
server unless `temporal.address` is set), the workers and the run workflow, then the
pumps. Stop order is the reverse, and every piece is stopped even when a later one
failed to start.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import AsyncExitStack

import aiohttp

from controller.placement import launch, shutdown, start_ray
from controller.runtime import Controller, RunSummary, prepare_run_dir
from controller.snapshot_wiring import start_snapshots, stop_snapshots
from controller.temporal_server import start_dev_server, stop_dev_server
from primitives.atomic_files import atomic_write_json
from schemas.config import TurnkeepConfig

log = logging.getLogger("turnkeep.run")


def new_run_id(cfg: TurnkeepConfig) -> str:
    return f"{cfg.run.run_dir.name}-{uuid.uuid4().hex[:6]}"


async def run_training(cfg: TurnkeepConfig, max_steps: int | None) -> RunSummary:
    # Participants in other processes get paths from us; they must not depend on our cwd.
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"run_dir": cfg.run.run_dir.resolve()})})
    run_dir = cfg.run.run_dir
    prepare_run_dir(run_dir)
    run_id = new_run_id(cfg)
    atomic_write_json(run_dir / "config.json", cfg.model_dump(mode="json"))
    atomic_write_json(run_dir / "run.json", {"run_id": run_id, "incarnation": 1})
    started = time.monotonic()
    async with AsyncExitStack() as stack:
        temporal_address = await _start_temporal(cfg, stack)
        start_ray(cfg, run_dir)
        processes = await launch(cfg)
        stack.push_async_callback(shutdown, processes)
        log.info("policy server %s, environment server %s, model %s", processes.policy_url, processes.env_url,
                 processes.model_dir)
        session = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None))
        )
        controller = Controller(cfg, processes, session, max_steps)
        watch = None
        if temporal_address is not None:
            snapshots = await start_snapshots(cfg, controller, session, temporal_address, run_id, incarnation=1)
            stack.push_async_callback(stop_snapshots, snapshots, "training finished", cfg.snapshot.phase_timeout_s)
            watch = snapshots.watch()
        await controller.run(max_steps, watch)
        return RunSummary(
            controller.training.step, time.monotonic() - started, run_dir, controller.last_metrics,
            controller.metrics.peak_rss_mib,
        )


async def _start_temporal(cfg: TurnkeepConfig, stack: AsyncExitStack) -> str | None:
    if not cfg.snapshot.enabled:
        return None
    if cfg.temporal.address is not None:
        return cfg.temporal.address
    endpoint = await start_dev_server(cfg.temporal, cfg.run.run_dir)
    stack.callback(stop_dev_server, endpoint)
    print(f"turnkeep: Temporal UI at {endpoint.ui_url} (server {endpoint.address})", flush=True)
    return endpoint.address
