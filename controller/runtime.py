"""One training run: place the processes, wire the pumps, run until `steps`, stop.

The controller owns the pumps, the data plane, the ledgers, the dataloader, the
admission gate and the deadline registry; each is its own small object, so the snapshot
work can reach each piece without going through a god class.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from controller.claim_ledger import ClaimLedger
from controller.data_plane import DataPlane
from controller.dataloader import PromptDataloader
from controller.env_client import EnvClient
from controller.group_ledger import GroupLedger
from controller.metrics import MetricsSink
from controller.placement import Processes, launch, shutdown, start_ray
from controller.rollout_pump import RolloutPump
from controller.run_stats import RunStats
from controller.train_pump import StepReport, TrainPump
from controller.trainer_checkpoint import write_trainer_checkpoint
from primitives.atomic_files import atomic_write_json
from primitives.deadlines import DeadlineRegistry
from primitives.holds import HoldSet
from schemas.config import TurnkeepConfig

log = logging.getLogger("turnkeep.run")


@dataclass
class RunSummary:
    steps: int
    wall_s: float
    run_dir: Path
    last_metrics: dict | None
    peak_rss_mib: float


class RunDirError(ValueError):
    """The run directory cannot be used for a new run."""


def prepare_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RunDirError(
            f"run directory {run_dir} is not empty; nothing in it was touched. "
            "Pick another run.run_dir (--run-dir) or remove the old run."
        )
    run_dir.mkdir(parents=True, exist_ok=True)


class Controller:
    def __init__(self, cfg: TurnkeepConfig, processes: Processes, session: aiohttp.ClientSession, max_steps: int | None):
        self.cfg = cfg
        self.processes = processes
        self.stats = RunStats()
        self.admission = HoldSet("admission")
        # Rollout clocks pause for their own holders (a snapshot, a colocated switch), not for a refit.
        self.deadline_holds = HoldSet("deadlines")
        self.deadlines = DeadlineRegistry(self.deadline_holds)
        self.dataloader = PromptDataloader(cfg.task, cfg.run.seed)
        self.ledger = GroupLedger()
        self.claims = ClaimLedger()
        self.data_plane = DataPlane()
        self.metrics = MetricsSink(cfg.run.run_dir, self.stats, max_steps)
        self.last_metrics: dict | None = None
        self.rollouts = RolloutPump(
            cfg.rollout,
            cfg.inflight_group_limit(),
            self.dataloader,
            self.ledger,
            self.data_plane,
            EnvClient(processes.env_url, session),
            self.admission,
            self.deadlines,
            self.stats,
            on_group_settled=lambda gid, ok: self.training.group_settled(gid, ok),
        )
        self.training = TrainPump(
            cfg.train,
            self.ledger,
            self.claims,
            self.data_plane,
            processes.trainer,
            processes.policy,
            self.admission,
            self.stats,
            on_groups_finished=self.rollouts.group_finished,
            write_checkpoint=self._checkpoint,
            on_step=self._on_step,
        )

    def _on_step(self, report: StepReport) -> None:
        self.last_metrics = self.metrics.step(report)

    def state_dict(self) -> dict:
        return {
            "step": self.training.step,
            "dataloader": self.dataloader.state_dict(),
            "data_plane": self.data_plane.state_dict(),
            "claim_ledger": self.claims.state_dict(),
            "group_ledger": self.ledger.state_dict(),
        }

    async def _checkpoint(self, step: int) -> None:
        async with self.data_plane.barrier:
            state = self.state_dict()
        await write_trainer_checkpoint(
            self.cfg.run.run_dir, step, self.processes.trainer, state, self.cfg.train.keep_checkpoints
        )

    async def run(self, max_steps: int | None) -> None:
        rollout_task = asyncio.create_task(self.rollouts.run(), name="rollout-pump")
        train_task = asyncio.create_task(self.training.run(max_steps), name="train-pump")
        done, _ = await asyncio.wait({rollout_task, train_task}, return_when=asyncio.FIRST_COMPLETED)
        rollout_task.cancel()
        await asyncio.gather(rollout_task, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()
        await train_task


async def run_training(cfg: TurnkeepConfig, max_steps: int | None) -> RunSummary:
    run_dir = cfg.run.run_dir
    prepare_run_dir(run_dir)
    atomic_write_json(run_dir / "config.json", cfg.model_dump(mode="json"))
    started = time.monotonic()
    start_ray(cfg, run_dir)
    processes = None
    try:
        log.info("starting trainer, policy server and environment server")
        processes = await launch(cfg)
        log.info("policy server %s, environment server %s, model %s", processes.policy_url, processes.env_url,
                 processes.model_dir)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            controller = Controller(cfg, processes, session, max_steps)
            await controller.run(max_steps)
        return RunSummary(
            controller.training.step,
            time.monotonic() - started,
            run_dir,
            controller.last_metrics,
            controller.metrics.peak_rss_mib,
        )
    finally:
        await shutdown(processes)
