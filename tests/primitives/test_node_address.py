"""`node` listens on the Ray node's address (loopback without Ray); a wildcard is advertised as that address."""

from __future__ import annotations

import turnkeep.primitives.node_address as node_address
from turnkeep.primitives.node_address import advertised_host, listen_host


def test_node_is_loopback_without_ray_and_explicit_hosts_stay(monkeypatch) -> None:
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # the suite's shared stack may run Ray in-process
    assert listen_host("node") == advertised_host("node") == "127.0.0.1"
    assert listen_host("10.0.0.5") == advertised_host("10.0.0.5") == "10.0.0.5"
    assert listen_host("0.0.0.0") == "0.0.0.0" and advertised_host("0.0.0.0") == "127.0.0.1"


def test_on_a_cluster_node_the_servers_use_its_address(monkeypatch) -> None:
    monkeypatch.setattr(node_address, "node_ip", lambda: "127.0.0.3")
    assert listen_host("node") == "127.0.0.3" and advertised_host("0.0.0.0") == "127.0.0.3"
