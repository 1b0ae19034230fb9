"""The recovery runs while the trainer's and the engines' workers start: their failure ends it at once with their
error, and their being slower does not hold it back; a recovery that fails leaves no worker of the controller
polling."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest
from temporalio import activity

from turnkeep.primitives.temporal_client import start_worker
from turnkeep.schemas.choices import AgentsMode
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.temporal import controller_worker as module
from turnkeep.workers.temporal.controller_worker import _unless_it_fails, start_snapshots


def test_workers_that_fail_to_start_cancel_the_recovery_and_their_error_is_raised() -> None:
    async def scenario() -> asyncio.Task:
        async def workers() -> None:
            await asyncio.sleep(0.01)
            raise RuntimeError("the trainer's worker could not connect")

        recovery = asyncio.ensure_future(asyncio.sleep(3600))
        with pytest.raises(RuntimeError, match="could not connect"):
            await _unless_it_fails(asyncio.ensure_future(workers()), recovery)
        return recovery

    assert asyncio.run(scenario()).cancelled()


def test_the_recovery_returns_while_the_workers_are_still_starting() -> None:
    async def scenario() -> tuple[str, bool]:
        workers = asyncio.ensure_future(asyncio.sleep(3600))

        async def recovery() -> str:
            return "restored"

        result = await _unless_it_fails(workers, recovery())
        still_starting = not workers.done()
        workers.cancel()
        return result, still_starting

    assert asyncio.run(scenario()) == ("restored", True)


@activity.defn(name="test.noop")
async def _noop() -> None:
    return None


@pytest.mark.integration
def test_a_recovery_that_fails_stops_the_controllers_activity_worker_before_raising(temporal_address, tmp_path,
                                                                                   monkeypatch) -> None:
    """A trainer killed during the recovery: the run stops its embedded Temporal server on the way out, and an
    activity worker still running then was cancelled only as the event loop closed; its shutdown waited for that
    server forever and the process never exited (`test_single_process_deaths` timed out in CI)."""
    started: list[asyncio.Task] = []

    def controller_worker(client, ctx, recovery, engine_keeper=None):
        worker, task = start_worker(client, f"test-{uuid.uuid4().hex[:6]}", activities=[_noop])
        started.append(task)
        return worker, task

    async def recovery_fails(*_args) -> None:
        raise RuntimeError("the trainer died during the recovery")

    async def trainer_worker(*_args) -> None:
        return None

    for name, fake in {"controller_worker": controller_worker, "_recover": recovery_fails,
                       "participant_clients": lambda *_args: ([], None), "controller_activities": lambda ctx, engine_keeper=None: [],
                       "bridged_activities": lambda *_args: [],
                       "RecoveryActivities": lambda *_args, **_kwargs: None,
                       "SnapshotCoordinator": lambda **kwargs: SimpleNamespace(**kwargs)}.items():
        monkeypatch.setattr(module, name, fake)
    engines = SimpleNamespace(live=lambda: [], indices=lambda: [], on_start=[])
    trainer = SimpleNamespace(start_temporal_worker=SimpleNamespace(remote=trainer_worker))
    controller = SimpleNamespace(processes=SimpleNamespace(trainer=trainer, engines=engines))
    cfg = TurnkeepConfig.model_validate({"run": {"run_dir": str(tmp_path)}})

    async def scenario() -> bool:
        with pytest.raises(RuntimeError, match="during the recovery"):
            await start_snapshots(cfg, controller, None, temporal_address, f"run-{uuid.uuid4().hex[:6]}", 2,
                                  recovery=object(), agents_mode=AgentsMode.JOURNAL)
        [task] = started
        return task.done()

    assert asyncio.run(scenario()), "the controller's activity worker was left polling"
