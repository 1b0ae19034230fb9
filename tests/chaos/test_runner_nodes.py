"""The chaos command with the `node` target: it brings its own two-node Ray cluster (head 127.0.0.2, node
127.0.0.3), the run's two engines spread over both, and the second node is taken away at a random moment and
joins again afterwards; the controller alone is killed too, and the next start re-attaches to the actors that
waited on the cluster. The run trains on through both, and the invariants hold."""

from __future__ import annotations

import orjson
import pytest

from tests.run_command import passing_chaos_run, small_run_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]


def test_a_lost_node_and_a_lost_controller_on_a_cluster_keep_every_invariant(stack_config) -> None:
    run_dir, report = passing_chaos_run(
        "tk-chaosn-", "--kills", "2", "--target", "node,controller", "--steps", "300",
        "--seed", "7", "--max-delay-s", "4", *small_run_settings(stack_config), "--set", "policy.engines=2",
        "--set", "policy.engine_restart_s=1",
        # Slower tools keep the run training while the lost engine's replacement starts (about 30 s here).
        "--set", "env.tool_latency_s=0.3",
    )
    rounds = {r["target"]: r for r in report["rounds"]}
    assert {target: r["outcome"] for target, r in rounds.items()} == {"node": "repaired", "controller": "killed"}
    # Engine 1 was placed on the second node (spread, round robin from the head) and went with it; the run
    # started its replacement on the head and trained on.
    assert rounds["node"]["lost"] == ["policy.1"], rounds["node"]
    assert all(r["ok"] for r in report["verdict"]["results"]), report["verdict"]["results"]
    # A controller crash on a cluster is survived as on the run's own Ray: the actors waited for the next start.
    second = run_dir / "chaos" / "incarnation-2.log"
    assert "re-attached the trainer" in second.read_text()
    engine_restarts = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()
                       if b'"engine_restart"' in line]
    assert [r["engine"] for r in engine_restarts] == [1], engine_restarts
