"""Where a run's server listens and the address others reach it at.

`node` (the default of `policy.host` and `env.host`) is the address Ray knows this process's node by: loopback on
the run's own Ray (which takes 127.0.0.1 as its node's address), the node's own address on a cluster, so an engine
on one node is reached from an environment server on another. A wildcard (`0.0.0.0`) listens everywhere and is
advertised as the node's address, never as itself (nobody can connect to 0.0.0.0).
"""

from __future__ import annotations

import sys

NODE = "node"
WILDCARDS = ("0.0.0.0", "::", "")
LOOPBACK = "127.0.0.1"


def node_ip() -> str:
    """The Ray node's address when this process is part of a Ray cluster, else loopback."""
    # Ray only if this process already loaded it: a process in a Ray cluster has (ray.init, or a Ray worker), and
    # `turnkeep env-server` never imports it (a host that only serves environments installs turnkeep without Ray).
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - Ray without a node: this machine alone
        pass
    return LOOPBACK


def listen_host(host: str) -> str:
    return node_ip() if host == NODE else host


def advertised_host(host: str) -> str:
    """The host in the URL handed to others for a server listening on `host`."""
    if host == NODE or host in WILDCARDS:
        return node_ip()
    return host
