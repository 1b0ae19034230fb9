"""The record activity: every attempt lands in metrics.jsonl; a long admission closure warns once."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import orjson

from turnkeep.activities.snapshot_activities import SnapshotActivities
from turnkeep.controller.snapshot.coordinator import SnapshotCoordinator
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.controller.stores.metrics import MetricsSink
from turnkeep.schemas.attempt_steps import AttemptRecord
from turnkeep.schemas.choices import Outcome, Trigger
from turnkeep.schemas.snapshot import SnapshotAttemptResult


def _result(n: int, closed_s: float, outcome: Outcome = Outcome.PUBLISHED) -> SnapshotAttemptResult:
    return SnapshotAttemptResult(
        checkpoint_id=f"run.snapshot.4.{n}", outcome=outcome, reason="why", anchor_step=4, trigger=Trigger.PERIODIC,
        admission_closed_s=closed_s,
    )


def test_every_attempt_is_a_metrics_line_and_a_long_closure_warns_once_with_the_fix(tmp_path):
    out = io.StringIO()
    controller = SimpleNamespace(metrics=MetricsSink(tmp_path, RunStats(), None, out=out))
    ctx = SnapshotCoordinator(
        run_id="run", incarnation=1, run_dir=tmp_path, fingerprint="f", controller=controller, trainer=None,
        environments=[], interval_s=2.0,
    )
    record = SnapshotActivities(ctx).record

    async def three_attempts():
        return [
            await record(AttemptRecord(result=_result(1, 0.5), consecutive_failures=0)),
            await record(AttemptRecord(result=_result(2, 3.0), consecutive_failures=0)),
            await record(AttemptRecord(result=_result(3, 4.0, Outcome.FAILED), consecutive_failures=1)),
        ]

    replies = asyncio.run(three_attempts())
    assert [r.warning is not None for r in replies] == [False, True, False]
    assert "Raise snapshot.attempt_interval_s" in replies[1].warning
    lines = [orjson.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes().splitlines()]
    assert [(line["kind"], line["outcome"]) for line in lines] == [
        ("snapshot", "published"), ("snapshot", "published"), ("snapshot", "failed")
    ]
    assert "warning" in lines[1] and lines[2]["consecutive_failures"] == 1
    assert "run.snapshot.4.3: failed" in out.getvalue() and "(why)" in out.getvalue()
