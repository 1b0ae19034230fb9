"""The embedded Temporal dev server and the run directory's record of it: a server left
running by a controller that was killed alone is taken over (or stopped and replaced) by
the next start, never doubled on one database; a stale record is dropped and the process
it names is left alone; a configured port held by anything else is refused in one line."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from turnkeep.cli.main import main
from turnkeep.primitives.pid_files import live_pid
from turnkeep.schemas.config_services import TemporalConfig
from turnkeep.workers.temporal import dev_server as temporal_server
from turnkeep.workers.temporal.dev_server import restart_dev_server, start_dev_server, stop_dev_server
from turnkeep.workers.temporal.pidfile import (
    ProcessId,
    ServerRecord,
    boot_id,
    cmdline,
    read_record,
    record_path,
    servers_on,
    write_record,
)
from turnkeep.workers.temporal.ports import TemporalStartError, free_port

pytestmark = pytest.mark.integration  # real dev servers, a few seconds each



def _servers(run_dir: Path) -> list[int]:
    return sorted(p.pid for p in servers_on(run_dir / "temporal.db"))


def _answers(address: str) -> bool:
    return asyncio.run(temporal_server._answers(address, "default", 5.0))


def _fake_record(run_dir: Path, pid: int, start_ticks: int, port: int = 1, ui_port: int = 2) -> None:
    """A record as a dead controller would have left it, naming `pid`."""
    owner = ProcessId.of(os.getpid())
    write_record(run_dir, ServerRecord(
        pid=pid, start_ticks=start_ticks, boot_id=boot_id(), owner_pid=owner.pid, owner_start_ticks=owner.start_ticks,
        address=f"127.0.0.1:{port}", ip="127.0.0.1", port=port, ui_port=ui_port, ui_url=f"http://127.0.0.1:{ui_port}",
        db=str(run_dir / "temporal.db"), namespace="default",
    ))


def test_a_server_left_by_a_killed_controller_is_taken_over_on_its_fixed_port(tmp_path) -> None:
    cfg = TemporalConfig(port=free_port("127.0.0.1"), ui_port=free_port("127.0.0.1"))
    began = time.monotonic()
    first = asyncio.run(start_dev_server(cfg, tmp_path))
    fresh_s = time.monotonic() - began
    leftover = first.process.pid
    record = orjson.loads(record_path(tmp_path).read_bytes())
    assert record["pid"] == leftover and record["port"] == cfg.port and record["db"] == str(tmp_path / "temporal.db")
    assert record_path(tmp_path).stat().st_mode & 0o777 == 0o600
    assert live_pid(tmp_path, "temporal") == leftover  # what `turnkeep chaos --target temporal` reads
    del first  # the controller is SIGKILLed: nothing stops its server, and its record stays

    began = time.monotonic()
    second = asyncio.run(start_dev_server(cfg, tmp_path))
    reused_s = time.monotonic() - began
    try:
        assert second.reused and second.pid == leftover and second.address == f"127.0.0.1:{cfg.port}"
        assert _servers(tmp_path) == [leftover]  # one server on the database, not two
        assert _answers(second.address)
        print(f"fresh start {fresh_s:.2f}s, start that took the leftover over {reused_s:.2f}s")
    finally:
        stop_dev_server(second)  # the run that took it over stops it at the end
    assert _servers(tmp_path) == []
    assert not ProcessId(leftover, record["start_ticks"]).running()
    assert not record_path(tmp_path).exists()


def test_a_leftover_server_that_does_not_answer_is_stopped_and_replaced(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(temporal_server, "REUSE_CHECK_S", 1.0)
    monkeypatch.setattr(temporal_server, "STOP_GRACE_S", 1.0)
    cfg = TemporalConfig(port=free_port("127.0.0.1"), ui_port=free_port("127.0.0.1"))
    first = asyncio.run(start_dev_server(cfg, tmp_path))
    hung = ProcessId.of(first.process.pid)
    os.kill(hung.pid, signal.SIGSTOP)  # alive, ours, but it answers nothing
    second = None
    try:
        second = asyncio.run(start_dev_server(cfg, tmp_path))
        assert not second.reused and second.pid != hung.pid
        assert not hung.running()
        assert _servers(tmp_path) == [second.pid]
        assert second.address == f"127.0.0.1:{cfg.port}" and _answers(second.address)
        assert read_record(tmp_path).pid == second.pid
    finally:
        if hung.running():
            os.kill(hung.pid, signal.SIGKILL)
        stop_dev_server(second)
        first.process.wait()


def test_a_record_naming_a_dead_pid_is_dropped(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(temporal_server, "REUSE_CHECK_S", 30.0)  # a record taken at its word would wait this long
    caplog.set_level(logging.INFO, logger="turnkeep.temporal")
    gone = subprocess.Popen(["sleep", "60"])
    ticks = ProcessId.of(gone.pid).start_ticks
    gone.kill()
    gone.wait()
    _fake_record(tmp_path, gone.pid, ticks)
    began = time.monotonic()
    endpoint = asyncio.run(start_dev_server(TemporalConfig(port=0, ui_port=0), tmp_path))
    try:
        assert time.monotonic() - began < 15
        assert f"names pid {gone.pid}, which is not this run directory's server" in caplog.text
        assert not endpoint.reused and endpoint.pid != gone.pid
        assert read_record(tmp_path).pid == endpoint.pid
        assert _servers(tmp_path) == [endpoint.pid]
    finally:
        stop_dev_server(endpoint)


def test_a_record_naming_an_unrelated_live_process_leaves_that_process_alone(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(temporal_server, "REUSE_CHECK_S", 30.0)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        # Even with its true start time the pid is not this run's server: its command line says so.
        _fake_record(tmp_path, sleeper.pid, ProcessId.of(sleeper.pid).start_ticks)
        began = time.monotonic()
        endpoint = asyncio.run(start_dev_server(TemporalConfig(port=0, ui_port=0), tmp_path))
        try:
            assert time.monotonic() - began < 15
            assert not endpoint.reused and endpoint.pid != sleeper.pid
            assert read_record(tmp_path).pid == endpoint.pid
        finally:
            stop_dev_server(endpoint)
        assert sleeper.poll() is None, "the unrelated process was killed"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_record_naming_another_runs_server_neither_takes_it_over_nor_stops_it(tmp_path) -> None:
    (tmp_path / "other").mkdir()
    other = asyncio.run(start_dev_server(TemporalConfig(port=0, ui_port=0), tmp_path / "other"))
    try:
        # The pid is a live dev server with its true start time, but on another run directory's database.
        mine = tmp_path / "mine"
        mine.mkdir()
        record = read_record(tmp_path / "other")
        _fake_record(mine, other.pid, other.server.start_ticks, record.port, record.ui_port)
        endpoint = asyncio.run(start_dev_server(TemporalConfig(port=0, ui_port=0), mine))
        try:
            assert not endpoint.reused and endpoint.pid != other.pid and endpoint.address != other.address
            assert _servers(mine) == [endpoint.pid]
        finally:
            stop_dev_server(endpoint)
        assert other.process.poll() is None and _servers(tmp_path / "other") == [other.pid]
    finally:
        stop_dev_server(other)


def _own_name() -> str:
    """This process's name as another process sees it: its command line's first word (pytest-xdist retitles its
    workers to the running test, so not always the interpreter's name)."""
    return Path(cmdline(os.getpid())[0]).name


def test_a_port_held_by_another_process_is_replaced_by_a_free_one_and_printed(tmp_path, capsys) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        endpoint = asyncio.run(start_dev_server(TemporalConfig(port=port, ui_port=0), tmp_path))
        try:
            chosen = int(endpoint.address.rsplit(":", 1)[1])
            assert chosen != port
            [line] = capsys.readouterr().err.strip().splitlines()
            assert line == (f"turnkeep: temporal.port = {port} on 127.0.0.1 is in use by pid {os.getpid()} "
                            f"({_own_name()}); Temporal of this run is on port {chosen} instead (set "
                            "temporal.port to choose another)")
        finally:
            stop_dev_server(endpoint)


def test_a_port_taken_between_its_choice_and_the_servers_bind_is_chosen_again(tmp_path, monkeypatch) -> None:
    """A CI run: the web UI's port, found free, was bound by another process before the dev server listened on
    it, and the run stopped with 'bind: address already in use'."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        choose = temporal_server.choose_port
        chosen: list[int] = []

        def racing(ip, wanted, setting, what):  # the first UI port is taken by the time the server binds it
            if setting != "temporal.ui_port":
                return choose(ip, wanted, setting, what)
            chosen.append(taken if not chosen else choose(ip, wanted, setting, what))
            return chosen[-1]

        monkeypatch.setattr(temporal_server, "choose_port", racing)
        endpoint = asyncio.run(start_dev_server(TemporalConfig(port=0, ui_port=0), tmp_path))
    try:
        assert chosen[0] == taken and len(chosen) == 2 and endpoint.ui_url == f"http://127.0.0.1:{chosen[1]}"
        assert _answers(endpoint.address) and _servers(tmp_path) == [endpoint.server.pid]
    finally:
        stop_dev_server(endpoint)


INTERNAL_PORT_RACE = (  # temporal.log of a CI run: the server's own worker service lost its ephemeral port
    'time=2026-12-06T19:03:24.230 level=ERROR msg="Failed to start gRPC listener" error="listen tcp '
    '127.0.0.1:42537: bind: address already in use" service=worker address=127.0.0.1:42537\n'
    "panic: runtime error: invalid memory address or nil pointer dereference\n"
    "goroutine 3268 [running]:\n"
    "go.temporal.io/server/service/worker.(*Service).Start(...)\n"
)


def test_a_start_whose_internal_service_lost_its_port_is_started_again(tmp_path, monkeypatch) -> None:
    """A CI run: the dev server's worker service found its ephemeral port taken, logged the error, then panicked;
    the last line (a stack frame) hid the cause and the run stopped. The first start here replays that log."""
    (tmp_path / "temporal.log").write_text("an earlier start's lines: level=ERROR something else\n")
    spawn = temporal_server._spawn
    starts: list[list[str]] = []

    def first_start_loses_the_race(endpoint):
        starts.append(list(endpoint.args))
        if len(starts) > 1:
            return spawn(endpoint)
        real = endpoint.args
        endpoint.args = [sys.executable, "-c", f"import sys; sys.stdout.write({INTERNAL_PORT_RACE!r}); sys.exit(2)",
                         *real]
        try:
            spawn(endpoint)
        finally:
            endpoint.args = real

    monkeypatch.setattr(temporal_server, "_spawn", first_start_loses_the_race)
    endpoint = asyncio.run(start_dev_server(TemporalConfig(port=0, ui_port=0), tmp_path))
    try:
        assert len(starts) == 2 and _answers(endpoint.address)
    finally:
        stop_dev_server(endpoint)


def test_a_start_failure_names_its_own_first_error_not_an_earlier_starts_or_a_stack_frame(tmp_path) -> None:
    log_file = tmp_path / "temporal.log"
    log_file.write_text("level=ERROR an earlier start's error\n")
    endpoint = temporal_server.TemporalEndpoint("127.0.0.1:1", None, run_dir=tmp_path,
                                                log_start=log_file.stat().st_size)
    with open(log_file, "a") as f:
        f.write(INTERNAL_PORT_RACE)
    named = temporal_server._start_failure(endpoint)
    assert "Failed to start gRPC listener" in named and temporal_server.ADDRESS_IN_USE in named
    endpoint.log_start = log_file.stat().st_size
    with open(log_file, "a") as f:
        f.write("Error: unknown flag --nope\n")
    assert temporal_server._start_failure(endpoint) == ": Error: unknown flag --nope"


def test_a_restart_whose_port_was_taken_meanwhile_is_refused_in_one_line(tmp_path) -> None:
    endpoint = asyncio.run(start_dev_server(TemporalConfig(port=0, ui_port=0), tmp_path))
    port = int(endpoint.address.rsplit(":", 1)[1])
    stop_dev_server(endpoint, forget=False)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(TemporalStartError) as raised:
            asyncio.run(restart_dev_server(endpoint))
    message = str(raised.value)
    assert "\n" not in message
    assert f"temporal.port = {port}: port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in message
    assert _servers(tmp_path) == []


@pytest.fixture
def restored_umask():
    before = os.umask(0o022)  # `turnkeep run` sets the run's private umask for the whole process
    os.umask(before)
    yield
    os.umask(before)


def test_turnkeep_run_names_an_address_it_cannot_listen_on_in_one_line_without_a_traceback(
        tmp_path, capsys, restored_umask) -> None:
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\nrun_dir = "{tmp_path / "run"}"\n[temporal]\nip = "192.0.2.77"\nui_port = 0\n')
    assert main(["run", "--config", str(config)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("turnkeep: temporal.ip = 192.0.2.77: the embedded server cannot listen there ("), line
    assert line.endswith("use 127.0.0.1 (the default) or an address of this machine"), line
    assert _servers(tmp_path / "run") == []
    assert not (tmp_path / "run").exists()  # named before Ray started (its keeper outlived the test) or a file was written


def test_the_database_is_in_wal_mode_and_a_started_workflow_survives_a_sigkill_of_the_server(tmp_path) -> None:
    import sqlite3

    from turnkeep.primitives.temporal_client import connect

    async def start_one(address: str) -> None:
        client = await connect(address, "default")
        await client.start_workflow("NobodyPollsThis", id="kept-through-a-kill", task_queue="nobody")

    async def described(address: str):
        client = await connect(address, "default")
        return await client.get_workflow_handle("kept-through-a-kill").describe()

    cfg = TemporalConfig(port=0, ui_port=0)
    first = asyncio.run(start_dev_server(cfg, tmp_path))
    second = None
    try:
        asyncio.run(start_one(first.address))
        os.kill(first.process.pid, signal.SIGKILL)  # the commit is all the kill leaves: no checkpoint, no close
        first.process.wait()
        assert (tmp_path / "temporal.db-wal").exists()
        with sqlite3.connect(f"file:{tmp_path / 'temporal.db'}?mode=ro", uri=True) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        second = asyncio.run(start_dev_server(cfg, tmp_path))
        assert not second.reused
        assert asyncio.run(described(second.address)).workflow_type == "NobodyPollsThis"
    finally:
        stop_dev_server(second)
