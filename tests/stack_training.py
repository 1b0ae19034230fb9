"""Train the session's shared stack for a few real steps through a Controller, as a run does: tests that need
turns of a policy newer than the first, or a trainer that has stepped, make it so instead of relying on the tests
that ran before them."""

from __future__ import annotations

import tempfile
from pathlib import Path

import aiohttp

from tests.controller_inputs import controller_inputs
from turnkeep.controller.runtime import Controller
from turnkeep.schemas.config import TurnkeepConfig


async def train_shared_stack(cfg: TurnkeepConfig, processes, start: int, steps: int) -> Controller:
    """`steps` train steps of the shared trainer from `start` (its current version); returns the controller, with
    the environment server's health after the run as `env_health`."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        controller = Controller(cfg, processes, session, start + steps, **controller_inputs(cfg))
        controller.training.continue_from(start, policy_version=start)  # the shared trainer: one version per step
        controller.start_journal("test-runtime", 1)  # as a run's start does, fresh or restored
        await controller.run(start + steps)
        async with session.get(f"{processes.env_url}/health") as resp:
            controller.env_health = await resp.json()
        return controller


def in_new_run_dir(cfg: TurnkeepConfig, prefix: str) -> TurnkeepConfig:
    run_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"run_dir": run_dir})})
