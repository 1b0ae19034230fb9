"""The chaos command with the `node` target, on a two-node Ray cluster it brings (head 127.0.0.2, node 127.0.0.3,
token authentication, reached through `ray.address` and `ray.token_file` as a user's own cluster is): the run's two
engines spread over both nodes, each serving on its own node's address; the second node is taken away at a random
moment, its engine with it, and the run trains on with a replacement on the head, no rollout retried; the node
joins again afterwards; the controller alone is killed too, and the next start re-attaches to the actors that
waited on the cluster. The invariants hold over all of it. The nodes are stopped by their pids, never `ray stop`."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.run_command import metrics, passing_chaos_run, small_run_settings
from turnkeep.chaos.local_cluster import HEAD_IP, WORKER_IP
from turnkeep.primitives.audit_log import read_audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]


def test_a_lost_node_and_a_lost_controller_on_a_cluster_keep_every_invariant(stack_config) -> None:
    run_dir, report = passing_chaos_run(
        "tk-chaosn-", "--kills", "2", "--target", "node,controller", "--steps", "200",
        "--seed", "7", "--max-delay-s", "4", *small_run_settings(stack_config), "--set", "policy.engines=2",
        "--set", "policy.engine_restart_s=1",
        # Slower tools keep the run training while the lost engine's replacement starts (about 30 s here). The
        # controller's kill came at step 113 to 133 in five runs; 200 steps leave the last start room to train.
        "--set", "env.tool_latency_s=0.3",
    )
    rounds = {r["target"]: r for r in report["rounds"]}
    assert {target: r["outcome"] for target, r in rounds.items()} == {"node": "repaired", "controller": "killed"}
    # Engine 1 was placed on the second node (spread, round robin from the head), served on that node's address,
    # and went with it; the run started its replacement on the head and trained on.
    assert rounds["node"]["lost"] == ["policy.1"], rounds["node"]
    assert urlsplit(rounds["node"]["lost_urls"]["policy.1"]).hostname == WORKER_IP, rounds["node"]
    [restart] = metrics(run_dir, "engine_restart")
    assert restart["engine"] == 1 and urlsplit(restart["url"]).hostname == HEAD_IP, restart
    print(f"\nengine 1 lost with its node; its replacement took turns {restart['seconds']:.1f} s later")
    assert all(r["ok"] for r in report["verdict"]["results"]), report["verdict"]["results"]
    # The lost engine's turns went to the other engine inside their policy calls: no rollout was retried before
    # the controller's kill (the restart after it may run a rollout again; that is the restore's business).
    second_start = [e.t for e in read_audit(run_dir) if e.event == "run_started"][1]
    first_steps = [m for m in metrics(run_dir, "train_step") if m["t"] < second_start]
    assert first_steps and first_steps[-1]["retries_total"] == 0, first_steps[-1:]
    # A controller crash on a cluster is survived as on the run's own Ray: the actors waited for the next start,
    # and that start, with the same command, finished the run.
    second = run_dir / "chaos" / "incarnation-2.log"
    assert "re-attached the trainer, the policy server and the environment server" in second.read_text()
    assert report["final_run"]["exit_code"] == 0
