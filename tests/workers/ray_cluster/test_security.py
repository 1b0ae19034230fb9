"""Ray locked down: a run's processes listen on loopback only, and its Ray checks a token."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import psutil
import pytest

from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.ray_cluster.security import RayTokenError, ensure_ray_token, ray_environment


def _cfg(tmp_path: Path, **ray) -> TurnkeepConfig:
    return TurnkeepConfig.model_validate({"run": {"run_dir": str(tmp_path / "run")}, "ray": ray})


def test_a_local_ray_gets_loopback_and_a_private_token(tmp_path, monkeypatch) -> None:
    cfg = _cfg(tmp_path)
    env = ray_environment(cfg)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert env["RAY_AUTH_TOKEN_PATH"] == str((tmp_path / "run" / "ray_token").resolve())
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    ensure_ray_token(cfg)
    token = tmp_path / "run" / "ray_token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) >= 32


def test_joining_a_cluster_without_its_token_is_refused_with_the_command(tmp_path, monkeypatch) -> None:
    cfg = _cfg(tmp_path, address="10.0.0.5:6379", token_file=str(tmp_path / "cluster_token"))
    env = ray_environment(cfg)
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env  # a cluster spans machines
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    with pytest.raises(RayTokenError, match="does not exist.*RAY_AUTH_MODE=token ray get-auth-token --generate"):
        ensure_ray_token(cfg)
    (tmp_path / "cluster_token").write_text("t0ken\n")
    (tmp_path / "cluster_token").chmod(0o644)
    with pytest.raises(RayTokenError, match="chmod 600"):
        ensure_ray_token(cfg)


def _listening(pids: list[int]) -> list[tuple[int, str, str, int]]:
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((pid, proc.name(), conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            continue
    return found


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def assert_every_listening_socket_is_on_loopback(proc, run_dir) -> None:
    """A running `turnkeep run` (its process and every child): every listening socket on loopback, Ray's token on.
    Checked inside a broad test that has such a run going (tests/workers/test_single_process_deaths.py), not with a run of
    its own."""
    tree = [proc.pid, *(child.pid for child in psutil.Process(proc.pid).children(recursive=True))]
    sockets = _listening(tree)
    for pid, name, ip, port in sorted(sockets, key=lambda s: s[1]):
        print(f"listening: {name:<22} pid {pid:<7} {ip}:{port}")
    names = {name for _, name, _, _ in sockets}
    # The run's own servers are all there: Temporal, Ray's GCS and raylet, and the actors' processes.
    assert {"temporal", "gcs_server", "raylet"} <= names, sockets
    open_wide = [s for s in sockets if not _is_loopback(s[2])]
    assert not open_wide, open_wide
    raylet = next(p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "raylet")
    assert raylet.environ().get("RAY_AUTH_MODE") == "token"
    assert (run_dir / "ray_token").stat().st_mode & 0o777 == 0o600
