"""A two-node Ray cluster on one machine, for tests: the head on 127.0.0.2, a second node on 127.0.0.3.

Each node is its own `ray start --block` in a session of its own, stopped by killing its process tree (never
`ray stop`, which kills every Ray on the machine, other runs' and tests' included). Ray rewrites 127.0.0.1 to
the machine's address, so the nodes use other loopback addresses. Token authentication as on a user's cluster.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from primitives.control_token import create_token_file
from primitives.process_tree import kill_tree
from workers.temporal.ports import free_port

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
START_S = 120.0
RAY = str(Path(sys.executable).with_name("ray"))


@dataclass
class Cluster:
    address: str
    token_file: Path
    head: subprocess.Popen
    worker: subprocess.Popen
    env: dict[str, str]

    def lose_worker_node(self) -> int:
        """The second node goes away at once, as a preempted machine does: every process of it SIGKILLed."""
        return kill_tree(self.worker.pid)

    def nodes_alive(self) -> int:
        out = subprocess.run([RAY, "status", "--address", self.address], capture_output=True, text=True,
                             env=self.env, timeout=60).stdout
        active = out.split("Active:", 1)[1].split("Pending:", 1)[0] if "Active:" in out else ""
        return len(re.findall(r"\bnode_[0-9a-f]+", active))


@contextmanager
def two_node_cluster(root: Path, cpus_per_node: int = 2) -> Iterator[Cluster]:
    root.mkdir(parents=True, exist_ok=True)
    token = root / "ray_token"
    create_token_file(token)
    # A local run's settings left in this process's environment would refuse a second node.
    inherited = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "VLLM_HOST_IP")}
    env = {**inherited, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    port = free_port("0.0.0.0")  # GCS listens on every interface off 127.0.0.1
    address = f"{HEAD_IP}:{port}"
    common = ["--block", "--num-cpus", str(cpus_per_node), "--disable-usage-stats"]
    head = _node([RAY, "start", "--head", "--node-ip-address", HEAD_IP, "--port", str(port), "--temp-dir",
                  str(root / "ray"), "--include-dashboard", "false", *common], env, root / "head.log")
    worker = None
    try:
        worker = _node([RAY, "start", "--address", address, "--node-ip-address", WORKER_IP, *common], env,
                       root / "worker.log")
        cluster = Cluster(address, token, head, worker, env)
        _wait(lambda: cluster.nodes_alive() == 2, "two live nodes", (head, worker))
        yield cluster
    finally:
        for node in (worker, head):
            if node is not None:
                kill_tree(node.pid)


def _node(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait(predicate, what: str, nodes) -> None:
    deadline = time.monotonic() + START_S
    while True:
        try:
            if predicate():
                return
        except (subprocess.SubprocessError, OSError):
            pass
        if any(node.poll() is not None for node in nodes):
            raise AssertionError(f"a Ray node exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {START_S:.0f}s")
        time.sleep(1.0)
