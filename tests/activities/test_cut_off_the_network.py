"""The cut asks the environment servers for the progress marker before it takes the
data-plane barrier, never under it: a server that hangs cannot hold the barrier (and with
it every row, ACK, cut and trainer checkpoint), and it still ends within the call's limit."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path

import aiohttp
import pytest
from temporalio.exceptions import ApplicationError

from tests.controller.pumps.test_env_timeouts import hanging_server
from turnkeep.activities.snapshot_activities import SnapshotActivities
from turnkeep.bench.filled_controller import STEP, FilledController
from turnkeep.controller.pumps.env_client import EnvClient
from turnkeep.controller.pumps.env_router import EnvRouter, EnvServerLink
from turnkeep.controller.snapshot.coordinator import SnapshotCoordinator
from turnkeep.controller.snapshot.cut import STATE_FILE
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.controller.stores import snapshot_store
from turnkeep.schemas.attempt_steps import CutInput, TrainerHoldResult
from turnkeep.schemas.names import ErrorType, checkpoint_id

RUN = "run"


def _setup(tmp_path: Path, env_client) -> tuple[SnapshotActivities, SnapshotCoordinator, Path]:
    controller = FilledController()
    controller.start_journal(tmp_path)
    controller.fill(rows=8, turns=2, parked=[], rng=random.Random(0))
    controller.stats = RunStats()
    controller.env_client = env_client
    (tmp_path / "checkpoints" / f"step_{STEP}").mkdir(parents=True)
    staging = snapshot_store.open_staging(tmp_path, STEP, 1)
    ctx = SnapshotCoordinator(run_id=RUN, incarnation=1, run_dir=tmp_path, fingerprint="f", controller=controller,
                              trainer=None, environments=[], interval_s=5)
    return SnapshotActivities(ctx), ctx, staging


def _cut_input(controller, staging: Path) -> CutInput:
    hold = TrainerHoldResult(step=STEP, policy_version=controller.training.policy_version)
    return CutInput(run_id=RUN, checkpoint_id=checkpoint_id(RUN, STEP, 1), incarnation=1, staging_dir=str(staging),
                    anchor_step=STEP, hold=hold)


class WatchingHealth:
    """An environment server's counters that notes whether the data-plane barrier was held when asked."""

    def __init__(self) -> None:
        self.barrier: asyncio.Lock | None = None
        self.asked_under_barrier: list[bool] = []

    async def health(self) -> dict:
        self.asked_under_barrier.append(self.barrier.locked())
        await asyncio.sleep(0)
        return {"turn_commits": 7}


def test_the_cut_asks_the_servers_before_the_barrier(tmp_path):
    env = WatchingHealth()
    acts, ctx, staging = _setup(tmp_path, env)
    env.barrier = ctx.controller.data_plane.barrier
    cut_id = checkpoint_id(RUN, STEP, 1)
    result = asyncio.run(acts.cut(_cut_input(ctx.controller, staging)))
    assert env.asked_under_barrier == [False]
    assert result.data_plane_rows == 8 and (staging / STATE_FILE).exists()
    assert ctx.cut_markers[cut_id][-1] == 7  # the marker still carries the servers' counters


def test_a_hung_environment_server_neither_holds_the_barrier_nor_blocks_the_cut(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="turnkeep.env")

    async def scenario() -> None:
        async with hanging_server() as (url, seen), aiohttp.ClientSession() as session:
            router = EnvRouter([EnvServerLink(EnvClient(url, session, "t", "calc", control_timeout_s=0.5), ["calc"])])
            acts, ctx, staging = _setup(tmp_path, router)
            barrier = ctx.controller.data_plane.barrier
            try:
                started = time.monotonic()
                cut = asyncio.ensure_future(acts.cut(_cut_input(ctx.controller, staging)))
                while "health" not in seen:
                    await asyncio.sleep(0.01)
                # The server sits on /health; meanwhile rows are stored and ACKed as usual.
                assert not barrier.locked()
                await asyncio.wait_for(barrier.acquire(), 0.1)
                barrier.release()
                result = await asyncio.wait_for(cut, 5)
                assert time.monotonic() - started < 3
                assert result.data_plane_rows == 8 and (staging / STATE_FILE).exists()
                assert router.away() and url in router.away()[0]
            finally:
                await router.close()

    asyncio.run(scenario())
    assert any("/health" in r.getMessage() and "127.0.0.1" in r.getMessage() and "did not answer" in r.getMessage()
               for r in caplog.records)


def test_an_ack_still_in_flight_fails_the_cut_with_its_receipt_and_writes_nothing(tmp_path):
    """A prepared server has no unACKed result, so an ACK in flight at the cut would be a row that server
    may save too: the attempt fails with a reason naming the receipt, and no state file is written."""
    env = WatchingHealth()
    acts, ctx, staging = _setup(tmp_path, env)
    env.barrier = ctx.controller.data_plane.barrier
    ctx.controller.data_plane.pending_acks.add("r-g7.0.1")
    with pytest.raises(ApplicationError, match=r"1 ACKs still in flight at the cut \(r-g7\.0\.1\)") as raised:
        asyncio.run(acts.cut(_cut_input(ctx.controller, staging)))
    assert raised.value.type == ErrorType.PARTICIPANT_REFUSED
    assert not (staging / STATE_FILE).exists()
    ctx.controller.data_plane.pending_acks.done("r-g7.0.1")
    assert asyncio.run(acts.cut(_cut_input(ctx.controller, staging))).data_plane_rows == 8
