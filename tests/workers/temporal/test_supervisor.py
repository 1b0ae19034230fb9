"""The embedded Temporal server killed alone mid-run comes back on the same database and
the same port within a second or two, and a workflow started before the kill goes on and
completes through the same worker and client; when restarts keep failing, the run gets a
one-line reason that names temporal.log. (A whole run whose Temporal server is killed alone:
tests/workers/test_single_process_deaths.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import uuid
from contextlib import closing
from pathlib import Path

import orjson
import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from turnkeep.primitives.pid_files import live_pid
from turnkeep.schemas.config_services import TemporalConfig
from turnkeep.workers.temporal.dev_server import TemporalEndpoint, start_dev_server, stop_dev_server
from turnkeep.workers.temporal.pidfile import ProcessId, servers_on
from turnkeep.workers.temporal.ports import free_port
from turnkeep.workers.temporal.supervisor import TemporalSupervisor

pytestmark = pytest.mark.integration  # real dev servers, a few seconds each


@workflow.defn(sandboxed=False)
class WaitForGo:
    def __init__(self) -> None:
        self.go = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.go)
        return "went"

    @workflow.signal
    def proceed(self) -> None:
        self.go = True



async def _until_back(supervisor: TemporalSupervisor, restarts: int, timeout_s: float = 20.0) -> float:
    began = time.monotonic()
    while supervisor.restarts < restarts:
        assert supervisor.reason is None, supervisor.reason
        assert time.monotonic() - began < timeout_s, "the server did not come back"
        await asyncio.sleep(0.05)
    return time.monotonic() - began


def _restart_lines(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_bytes().splitlines()
    return [row for row in map(orjson.loads, lines) if row["kind"] == "temporal_restart"]


async def _killed_mid_workflow(run_dir: Path, cfg: TemporalConfig, endpoint: TemporalEndpoint,
                               frozen: bool = False) -> None:
    """SIGKILLed alone (or `frozen`: SIGSTOPped, for the health check to find) mid-workflow."""
    supervisor = TemporalSupervisor(endpoint, hang_s=2.0 if frozen else None)
    supervisor.start()
    client = await Client.connect(endpoint.address)
    queue = f"q-{uuid.uuid4().hex[:6]}"
    worker = Worker(client, task_queue=queue, workflows=[WaitForGo], workflow_runner=UnsandboxedWorkflowRunner())
    worker_task = asyncio.create_task(worker.run())
    try:
        handle = await client.start_workflow(WaitForGo.run, id=f"wait-{queue}", task_queue=queue)
        killed = endpoint.server
        os.kill(killed.pid, signal.SIGSTOP if frozen else signal.SIGKILL)  # the server alone, as the OOM killer picks it
        back_s = await _until_back(supervisor, 1, timeout_s=30)
        print(f"{'frozen' if frozen else 'killed'} -> serving again in {back_s:.2f}s")
        assert back_s < (30 if frozen else 5)
        if frozen:
            [hang] = [row for row in map(orjson.loads, (run_dir / "metrics.jsonl").read_bytes().splitlines())
                      if row["kind"] == "hang"]
            assert hang["target"] == "temporal" and hang["pid"] == killed.pid and hang["probe"] == "health check"
            assert supervisor.hangs == 1
        assert endpoint.pid != killed.pid and not killed.running()
        assert endpoint.address == f"{cfg.ip}:{cfg.port}"  # the same port: clients and workers keep their address
        assert [p.pid for p in servers_on(run_dir / "temporal.db")] == [endpoint.pid]
        assert live_pid(run_dir, "temporal") == endpoint.pid  # the record follows the new process
        [line] = _restart_lines(run_dir)
        assert line["restarts"] == 1 and line["old_pid"] == killed.pid and line["pid"] == endpoint.pid
        # The history survived in the database; the same client and worker carry the workflow to its end.
        assert (await handle.describe()).id == handle.id
        await handle.signal(WaitForGo.proceed)
        assert await asyncio.wait_for(handle.result(), 30) == "went"
        assert not worker_task.done()
    finally:
        await worker.shutdown()
        await supervisor.stop()
        stop_dev_server(endpoint)
    assert servers_on(run_dir / "temporal.db") == []


def test_a_killed_server_comes_back_on_its_port_and_a_workflow_started_before_completes(tmp_path) -> None:
    cfg = TemporalConfig(port=0, ui_port=0)  # chosen once: the restart keeps them

    async def scenario() -> None:
        endpoint = await start_dev_server(cfg, tmp_path)
        port = int(endpoint.address.rsplit(":", 1)[1])
        await _killed_mid_workflow(tmp_path, cfg.model_copy(update={"port": port}), endpoint)

    asyncio.run(scenario())


def test_a_taken_over_server_is_watched_through_its_pid(tmp_path) -> None:
    cfg = TemporalConfig(port=free_port("127.0.0.1"), ui_port=0)
    leftover = asyncio.run(start_dev_server(cfg, tmp_path))
    del leftover  # its controller died; the next one takes the server over and has no process handle for it

    async def scenario() -> None:
        endpoint = await start_dev_server(cfg, tmp_path)
        assert endpoint.reused and endpoint.process is None
        await _killed_mid_workflow(tmp_path, cfg, endpoint)

    asyncio.run(scenario())


def test_a_frozen_server_is_killed_by_pid_and_restarted_and_a_workflow_started_before_completes(tmp_path) -> None:
    """SIGSTOPped, the server still accepts connections and answers nothing: the health check misses for
    `hang_s`, the supervisor SIGKILLs it (a SIGCONT later cannot bring it back beside its replacement), restarts it
    on the same database and says so in one `hang` line."""
    cfg = TemporalConfig(port=free_port("127.0.0.1"), ui_port=0)

    async def scenario() -> None:
        endpoint = await start_dev_server(cfg, tmp_path)
        await _killed_mid_workflow(tmp_path, cfg, endpoint, frozen=True)

    asyncio.run(scenario())


def test_restarts_that_keep_failing_stop_the_run_with_a_reason_naming_temporal_log(tmp_path) -> None:
    cfg = TemporalConfig(port=free_port("127.0.0.1"), ui_port=0)

    async def scenario() -> None:
        endpoint = await start_dev_server(cfg, tmp_path)
        supervisor = TemporalSupervisor(endpoint)
        supervisor.start()
        try:
            # Killed, and its port taken by something else before the supervisor looks (no await in between).
            endpoint.process.kill()
            endpoint.process.wait()
            with closing(socket.socket()) as squatter:
                squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the killed server's TIME_WAITs
                squatter.bind(("127.0.0.1", cfg.port))
                squatter.listen()
                began = time.monotonic()
                reason = await asyncio.wait_for(supervisor.lost(), 20)
                print(f"gave up after {time.monotonic() - began:.2f}s: {reason}")
            assert "\n" not in reason
            assert "3 restarts in a row failed" in reason and reason.endswith(f"see {tmp_path / 'temporal.log'}")
            assert supervisor.restarts == 0
        finally:
            await supervisor.stop()
            stop_dev_server(endpoint)
        assert servers_on(tmp_path / "temporal.db") == []

    asyncio.run(scenario())


def test_the_servers_own_stop_is_not_taken_for_a_death(tmp_path) -> None:
    async def scenario() -> None:
        endpoint = await start_dev_server(TemporalConfig(port=0, ui_port=0), tmp_path)
        supervisor = TemporalSupervisor(endpoint, poll_s=0.05)
        supervisor.start()
        await asyncio.sleep(0.2)
        server = endpoint.server
        await supervisor.stop()  # the run's way out: the supervisor first, then the server
        stop_dev_server(endpoint)
        await asyncio.sleep(0.3)
        assert supervisor.restarts == 0 and not server.running()
        assert servers_on(tmp_path / "temporal.db") == []
        assert ProcessId.of(server.pid) is None or not ProcessId.of(server.pid).running()

    asyncio.run(scenario())


def test_the_run_starts_its_server_supervised_and_stops_both_in_order(tmp_path) -> None:
    from contextlib import AsyncExitStack

    from turnkeep.schemas.config import TurnkeepConfig
    from turnkeep.workers.run_session import KeptForRebuild, _start_temporal

    cfg = TurnkeepConfig.model_validate({"run": {"run_dir": str(tmp_path)}, "temporal": {"port": 0, "ui_port": 0}})

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            address, supervisor = await _start_temporal(cfg, stack, KeptForRebuild())
            server = supervisor.endpoint.server
            assert address == supervisor.endpoint.address and server.running()
            os.kill(server.pid, signal.SIGKILL)
            await _until_back(supervisor, 1)
            server = supervisor.endpoint.server
        assert not server.running() and supervisor.restarts == 1  # stopped at the end, not restarted again
        assert servers_on(tmp_path / "temporal.db") == [] and not (tmp_path / "pids" / "temporal.json").exists()

    asyncio.run(scenario())
