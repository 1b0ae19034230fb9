"""The chaos command with trainer-rank kills: a run with two trainer ranks, one rank SIGKILLed at a random moment
and then rank 0; each time the run replaces the whole trainer group, restores into it by itself and trains on with
the same policy engine and environment server, no restart; the invariants hold over all of it."""

from __future__ import annotations

import pytest

from tests.run_command import metrics, passing_chaos_run, ray_worker_logs, small_run_settings
from turnkeep.primitives.audit_log import read_audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]


def test_trainer_rank_kills_rebuild_the_group_and_keep_every_invariant(stack_config) -> None:
    run_dir, report = passing_chaos_run(
        "tk-chaosr-", "--kills", "2", "--target", "rank,trainer", "--steps", "80",
        "--seed", "11", "--max-delay-s", "4", *small_run_settings(stack_config), "--set", "train.ranks=2",
        "--set", "env.tool_latency_s=0.3",
    )
    rounds = {r["target"]: r for r in report["rounds"]}
    assert {target: r["outcome"] for target, r in rounds.items()} == {"rank": "repaired", "trainer": "repaired"}
    assert all(r["ok"] for r in report["verdict"]["results"]), report["verdict"]["results"]
    # Both deaths were repaired inside the one `turnkeep run` process the chaos run started.
    first = (run_dir / "chaos" / "incarnation-1.log").read_text()
    assert first.count("rebuilding the trainer and restoring into it") == 2, first[-3000:]
    assert "trainer rank 1 of 2 died" in ray_worker_logs(run_dir)  # the trainer's own line, written before it exits
    assert len(metrics(run_dir, "trainer_rebuild")) == 2
    # Each rebuild is an incarnation of its own that restored (from the newest snapshot, or afresh when a kill
    # came before the first checkpoint: the moment is chaos's) into a two-rank group, which then trained.
    restores = [e for e in read_audit(run_dir) if e.event == "restored"]
    assert len(restores) == 2, [(e.inc, e.source) for e in restores]
    assert {m["trainer_ranks"] for m in metrics(run_dir, "train_step")} == {2}
