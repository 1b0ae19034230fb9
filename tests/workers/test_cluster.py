"""A run on a two-node Ray cluster (head 127.0.0.2, second node 127.0.0.3, token authentication, as a user's
cluster is reached through `ray.address`): its two engines spread over both nodes and serve on their node's
address; the second node goes away mid-run, its engine with it, and the run trains on with a replacement on the
node that is left; then the controller alone is killed, the run's actors wait on the cluster, and the same
command re-attaches to them and finishes, stopping them. The nodes are stopped by their pids, never `ray stop`."""

from __future__ import annotations

import json
import os
import signal
from urllib.parse import urlsplit

import pytest

from tests.run_command import metrics, short_run_dir, small_run_settings, train_steps, turnkeep, wait_until
from turnkeep.chaos.local_cluster import HEAD_IP, WORKER_IP, two_node_cluster
from turnkeep.chaos.targets import kill_everything
from turnkeep.primitives.pid_files import live_pid

pytestmark = pytest.mark.integration


def _engine_hosts(run_dir) -> dict[int, str]:
    engines = json.loads((run_dir / "status.json").read_text()).get("engines", [])
    return {e["engine"]: urlsplit(e["url"]).hostname for e in engines if e["state"] == "live"}


def test_a_two_node_cluster_loses_a_node_and_the_run_trains_on(stack_config) -> None:
    run_dir = short_run_dir("tk-cluster-")
    log = run_dir.parent / "turnkeep.log"
    with two_node_cluster(run_dir.parent / "cluster") as cluster:
        settings = [*small_run_settings(stack_config), "--set", f"ray.address={cluster.address}",
                    "--set", f"ray.token_file={cluster.token_file}", "--set", "policy.engines=2",
                    "--set", "policy.engine_restart_s=1"]
        proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, log=log)
        try:
            wait_until(lambda: train_steps(run_dir) >= 3, 420, "training on the cluster", proc)
            wait_until(lambda: len(_engine_hosts(run_dir)) == 2, 60, "both engines in the live status", proc)
            # Spread over the nodes, each serving on its own node's address (reached from the other node).
            assert sorted(_engine_hosts(run_dir).values()) == [HEAD_IP, WORKER_IP], _engine_hosts(run_dir)
            lost = next(k for k, host in _engine_hosts(run_dir).items() if host == WORKER_IP)
            steps = train_steps(run_dir)
            assert cluster.lose_worker_node() > 0
            wait_until(lambda: metrics(run_dir, "engine_restart"), 300, "a replacement for the lost engine", proc)
            wait_until(lambda: train_steps(run_dir) >= steps + 3, 300, "training after the node was lost", proc)
            wait_until(lambda: len(_engine_hosts(run_dir)) == 2, 60, "two live engines again", proc)
            assert set(_engine_hosts(run_dir).values()) == {HEAD_IP}, _engine_hosts(run_dir)
            assert cluster.nodes_alive() == 1
            # The lost engine's turns went to the other engine inside their policy calls: no rollout was retried.
            assert metrics(run_dir, "train_step")[-1]["retries_total"] == 0
            engines_before = {role: live_pid(run_dir, role) for role in ("trainer", "policy", "policy.1")}

            # The controller alone dies; the run's actors wait on the cluster and the same command re-attaches.
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            steps = train_steps(run_dir)
            again_log = run_dir.parent / "again.log"
            again = turnkeep("run", "--run-dir", str(run_dir), "--steps", str(steps + 3), *settings, log=again_log)
            assert again.wait(timeout=600) == 0, again_log.read_text()[-3000:]
            assert "re-attached the trainer, the policy server and the environment server" in again_log.read_text()
            assert train_steps(run_dir) > steps
            assert {role: live_pid(run_dir, role) for role in engines_before} == {role: None for role in engines_before}
        finally:
            for running in (proc, locals().get("again")):
                if running is not None and running.poll() is None:
                    os.killpg(running.pid, signal.SIGKILL)
            kill_everything(run_dir, None)
    print(f"re-attached on the cluster: the engines kept pids {engines_before} until the run ended")
    [restart] = metrics(run_dir, "engine_restart")
    assert restart["engine"] == lost
    print(f"\nengine {lost} lost with its node; its replacement took turns {restart['seconds']:.1f} s later")
