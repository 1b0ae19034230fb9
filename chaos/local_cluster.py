"""A two-node Ray cluster on one machine: the head on 127.0.0.2, a second node on 127.0.0.3. `turnkeep chaos`
runs on it when a kill target is `node`; the cluster tests use it too.

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
from pathlib import Path

import psutil

from turnkeep.primitives.control_token import create_token_file
from turnkeep.primitives.process_tree import kill_tree
from turnkeep.workers.temporal.ports import free_port

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
START_S = 120.0
RAY = str(Path(sys.executable).with_name("ray"))
INHERITED_LOCAL_SETTINGS = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "VLLM_HOST_IP")
"""A local run's settings left in this process's environment would make a second node refuse to start."""


class ClusterError(RuntimeError):
    """A node of the local cluster did not start or exited."""


class LocalCluster:
    """The two nodes, started; `lose_worker_node` and `restart_worker_node` take the second one away and back."""

    def __init__(self, root: Path, cpus_per_node: int = 2) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.token_file = root / "ray_token"
        create_token_file(self.token_file)
        inherited = {k: v for k, v in os.environ.items() if k not in INHERITED_LOCAL_SETTINGS}
        self.env = {**inherited, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_file)}
        port = free_port("0.0.0.0")  # GCS listens on every interface off 127.0.0.1
        self.address = f"{HEAD_IP}:{port}"
        self._common = ["--block", "--num-cpus", str(cpus_per_node), "--disable-usage-stats"]
        self.worker: subprocess.Popen | None = None
        self.head = self._node(["--head", "--node-ip-address", HEAD_IP, "--port", str(port), "--temp-dir",
                                str(root / "ray"), "--include-dashboard", "false"], "head.log")
        try:
            self.restart_worker_node()
        except BaseException:
            self.close()
            raise

    def settings(self) -> list[str]:
        """`--set` pairs that point a run at this cluster."""
        return [f"ray.address={self.address}", f"ray.token_file={self.token_file}"]

    def lose_worker_node(self) -> int:
        """The second node goes away at once, as a preempted machine does: every process of it SIGKILLed."""
        return kill_tree(self.worker.pid) if self.worker is not None else 0

    def worker_node_pids(self) -> set[int]:
        """Every live process of the second node (its raylet and the workers and actors under it)."""
        if self.worker is None:
            return set()
        try:
            root = psutil.Process(self.worker.pid)
            return {root.pid, *(child.pid for child in root.children(recursive=True))}
        except psutil.Error:
            return set()

    def restart_worker_node(self) -> None:
        """A (new) second node joins, and both nodes are live."""
        if self.worker is not None:
            kill_tree(self.worker.pid)
            # The head counts a lost node live until its health checks fail: the new node must not be mistaken
            # for it.
            self.worker = None  # its exit is expected now
            self._wait(lambda: self.nodes_alive() == 1, "the lost node to be marked dead")
        self.worker = self._node(["--address", self.address, "--node-ip-address", WORKER_IP], "worker.log")
        self._wait(lambda: self.nodes_alive() == 2, "two live nodes")

    def nodes_alive(self) -> int:
        out = subprocess.run([RAY, "status", "--address", self.address], capture_output=True, text=True,
                             env=self.env, timeout=60).stdout
        active = out.split("Active:", 1)[1].split("Pending:", 1)[0] if "Active:" in out else ""
        return len(re.findall(r"\bnode_[0-9a-f]+", active))

    def close(self) -> None:
        for node in (self.worker, self.head):
            if node is not None:
                kill_tree(node.pid)

    def _node(self, arguments: list[str], log_name: str) -> subprocess.Popen:
        with open(self.root / log_name, "ab") as out:
            return subprocess.Popen([RAY, "start", *arguments, *self._common], stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env, start_new_session=True)

    def _wait(self, predicate, what: str) -> None:
        deadline = time.monotonic() + START_S
        while True:
            try:
                if predicate():
                    return
            except (subprocess.SubprocessError, OSError):
                pass
            exited = [name for name, node in (("head", self.head), ("second", self.worker))
                      if node is not None and node.poll() is not None]
            if exited:
                raise ClusterError(f"the {' and '.join(exited)} Ray node exited while waiting for {what}; see "
                                   f"{self.root}/*.log")
            if time.monotonic() > deadline:
                raise ClusterError(f"no {what} within {START_S:.0f}s; see {self.root}/*.log")
            time.sleep(1.0)


@contextmanager
def two_node_cluster(root: Path, cpus_per_node: int = 2) -> Iterator[LocalCluster]:
    cluster = LocalCluster(root, cpus_per_node)
    try:
        yield cluster
    finally:
        cluster.close()
