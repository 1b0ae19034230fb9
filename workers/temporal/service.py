"""A Temporal we did not start (`temporal.address`): docker-compose.yml, a team's cluster,
Temporal Cloud. Checked before anything is written: the server answers (over TLS or
with an API key when `[temporal]` says so), the namespace exists, and turnkeep's search
attributes are registered (added when the server lets us, otherwise named with the
command that adds them). Each problem is one line naming the fix.
"""

from __future__ import annotations

import asyncio

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.config.loader import ConfigError
from turnkeep.primitives.temporal_client import TemporalSecurityError, connect
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.temporal.dev_server import register_search_attributes

CONNECT_TIMEOUT_S = 15.0


class TemporalUnusable(ConfigError):
    """The configured Temporal cannot run this run's workflows; the message says why and what to do."""


async def check_temporal_service(cfg: TurnkeepConfig) -> None:
    """Nothing to check for the embedded dev server (the run starts it) or with snapshots off."""
    temporal = cfg.temporal
    if not cfg.snapshot.enabled or temporal.address is None:
        return
    where = f"temporal.address = {temporal.address!r}"
    try:
        client = await asyncio.wait_for(connect(temporal.address, temporal.namespace, temporal.security()),
                                        CONNECT_TIMEOUT_S)
        await asyncio.wait_for(client.service_client.check_health(), CONNECT_TIMEOUT_S)
    except TemporalSecurityError as err:
        raise TemporalUnusable(str(err)) from None
    except (RuntimeError, RPCError, OSError, asyncio.TimeoutError) as err:
        reason = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
        raise TemporalUnusable(
            f"{where}: no Temporal server answers ({reason}); start one (`docker compose up -d` in the repository, "
            "docs/operations.md, \"Run against your own Temporal\"), or fix the address and the TLS / API key settings"
        ) from None
    await _check_namespace(client, temporal.namespace, where)
    try:
        await register_search_attributes(client, temporal.namespace)
    except RuntimeError as err:
        raise TemporalUnusable(str(err).replace("\n", " ")) from None


async def _check_namespace(client: Client, namespace: str, where: str) -> None:
    try:
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise TemporalUnusable(
                f"{where}: namespace {namespace!r} does not exist there; create it (`temporal operator namespace "
                f"create --namespace {namespace}`) or set temporal.namespace"
            ) from None
        if err.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED):
            raise TemporalUnusable(f"{where}: the server refuses this client for namespace {namespace!r} ({err}); "
                                   "check temporal.tls_cert / tls_key or temporal.api_key_file") from None
        raise
