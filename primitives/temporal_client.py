"""A Temporal client and a worker, the same way in every process that runs one.

Each process has its own task queue (`schemas.names`): the controller's runs the
workflows and the control activities, the trainer's runs the hold. A server we did not
start may need TLS (a client certificate, a CA) or an API key (Temporal Cloud): every
process reads the same files named by `[temporal]`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig
from temporalio.worker import Worker

from schemas.config import TemporalSecurity


class TemporalSecurityError(ValueError):
    """A TLS or API key file named by [temporal] cannot be read; the message names it."""


async def connect(address: str, namespace: str, security: TemporalSecurity | None = None) -> Client:
    security = security or TemporalSecurity()
    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter, tls=tls_config(security),
        api_key=_read_text(security.api_key_file, "api_key_file").strip() if security.api_key_file else None,
    )


def tls_config(security: TemporalSecurity) -> TLSConfig | bool:
    if not security.uses_tls():
        return False
    return TLSConfig(
        server_root_ca_cert=_read(security.tls_ca, "tls_ca"),
        client_cert=_read(security.tls_cert, "tls_cert"),
        client_private_key=_read(security.tls_key, "tls_key"),
        domain=security.tls_server_name,
    )


def _read(path: Path | None, key: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as err:
        raise TemporalSecurityError(f"temporal.{key} = {str(path)!r} cannot be read ({err.strerror}); "
                                    "give a readable PEM file") from None


def _read_text(path: Path, key: str) -> str:
    data = _read(path, key)
    assert data is not None
    return data.decode()


def start_worker(client: Client, task_queue: str, *, activities: Sequence = (), workflows: Sequence = ()) -> tuple[Worker, asyncio.Task]:
    worker = Worker(
        client, task_queue=task_queue, activities=list(activities), workflows=list(workflows),
        max_concurrent_activities=32,
    )
    return worker, asyncio.get_running_loop().create_task(worker.run(), name=f"worker:{task_queue}")
