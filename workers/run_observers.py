"""What watches a running controller from beside it, started and stopped with the run: the
trainer's and the policy server's holds sampled into the audit log and `status.json`
(`controller.remote_holds`, `controller.live_status`), the TensorBoard and W&B mirrors when asked for,
and the stall watchdog."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

from turnkeep.controller.live_status import live_status, write_live_status
from turnkeep.controller.remote_holds import RemoteHoldWatch, process_samplers, stop_watching
from turnkeep.controller.restore.run_identity import RunIdentity
from turnkeep.controller.stall_watchdog import env_turn_commits, watch_for_stalls
from turnkeep.controller.stores.tensorboard_mirror import TensorBoardMirror, keep_mirroring
from turnkeep.controller.stores.wandb_mirror import WandbMirror
from turnkeep.schemas.config import TurnkeepConfig


class RunObservers:
    def __init__(self, holds: RemoteHoldWatch, sampling: asyncio.Task) -> None:
        self._holds = holds
        self._sampling = sampling

    async def last_sample(self) -> None:
        """Before `run_ended`: a release just before the end is not taken for a holder left behind."""
        await stop_watching(self._sampling)
        await self._holds.sample()


def start_observers(stack: AsyncExitStack, cfg: TurnkeepConfig, controller, processes, run_dir: Path,
                    identity: RunIdentity) -> RunObservers:
    incarnation = identity.incarnation
    holds = RemoteHoldWatch(process_samplers(processes), controller.audit_hold)
    sampling = asyncio.create_task(holds.run(after_each=lambda: write_live_status(
        run_dir, live_status(controller, holds.holders(), incarnation))))
    stack.push_async_callback(stop_watching, sampling)
    if cfg.metrics.tensorboard:
        stack.push_async_callback(stop_watching, asyncio.create_task(keep_mirroring(TensorBoardMirror(run_dir))))
    if cfg.metrics.wandb:
        mirror = WandbMirror(run_dir, identity.run_id, cfg.metrics)
        stack.push_async_callback(stop_watching, asyncio.create_task(keep_mirroring(mirror)))
    stack.push_async_callback(stop_watching, asyncio.create_task(watch_for_stalls(
        controller, holds.holders, cfg.watchdog.stall_s, cfg.watchdog.check_every_s,
        env_turn_commits(controller.env_client))))
    return RunObservers(holds, sampling)
