import asyncio
import uuid
from datetime import timedelta

import orjson
import pytest
from temporalio import activity, workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from turnkeep.bench.attempt_history import HistoryTimes
from turnkeep.bench.orchestration import (
    AttemptCost,
    attempt_costs,
    costs_of_run_dir,
    local_clocks_of,
    percentile,
    result_of,
)
from turnkeep.primitives.temporal_client import connect
from turnkeep.schemas import search_attributes as sa
from turnkeep.schemas.config_services import TemporalConfig
from turnkeep.workers.temporal.dev_server import start_dev_server, stop_dev_server

NAP_S = 0.05


@activity.defn(name="orchestration_probe.nap")
async def nap() -> None:
    await asyncio.sleep(NAP_S)


@workflow.defn(name="OrchestrationProbe")
class TwoNaps:
    @workflow.run
    async def run(self) -> str:
        for _ in range(2):
            await workflow.execute_activity(nap, start_to_close_timeout=timedelta(seconds=30))
        return "done"


@workflow.defn(name="OrchestrationProbe")
class NapThenLocalNap:
    @workflow.run
    async def run(self) -> str:
        await workflow.execute_activity(nap, start_to_close_timeout=timedelta(seconds=30))
        await workflow.execute_local_activity(nap, start_to_close_timeout=timedelta(seconds=30))
        return "done"


async def closed_costs(client, run_id: str) -> list[AttemptCost]:
    # Visibility is eventually consistent: the closed execution shows up a little later.
    for _ in range(100):
        costs = await attempt_costs(client, run_id, workflow_type="OrchestrationProbe")
        if costs:
            return costs
        await asyncio.sleep(0.1)
    raise AssertionError("the closed probe workflow never showed in the visibility list")


async def probe(address: str, run_id: str, probe_workflow=TwoNaps) -> list[AttemptCost]:
    client = await connect(address, "default")
    queue = f"{run_id}.probe"
    # The sandbox would re-import this test module (pytest and all); the probe needs none of its checks.
    async with Worker(client, task_queue=queue, workflows=[probe_workflow], activities=[nap],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        await client.execute_workflow(
            probe_workflow.run, id=f"{run_id}.probe.1", task_queue=queue,
            search_attributes=TypedSearchAttributes([
                SearchAttributePair(sa.RUN_ID, run_id), SearchAttributePair(sa.TRIGGER, "operator"),
            ]),
        )
    return await closed_costs(client, run_id)


def test_a_real_history_splits_into_activity_time_and_orchestration(temporal_address):
    [cost] = asyncio.run(probe(temporal_address, f"orch-{uuid.uuid4().hex[:8]}"))
    assert cost.times.activities == 2
    assert 2 * NAP_S * 0.9 <= cost.times.inside_s < cost.times.wall_s
    assert cost.orchestration_s == pytest.approx(cost.times.wall_s - cost.times.inside_s)
    assert cost.orchestration_s >= 0
    assert cost.trigger == "operator"
    assert cost.outcome == "completed"  # it never set TurnkeepOutcome: the close event says


def test_a_real_local_activity_is_inside_time_and_needs_no_workflow_task_of_its_own(temporal_address):
    [cost] = asyncio.run(probe(temporal_address, f"orch-{uuid.uuid4().hex[:8]}", NapThenLocalNap))
    assert (cost.times.activities, cost.times.local_activities) == (2, 1)
    assert cost.times.workflow_tasks == 2  # the start, and the one after the remote nap that runs the local one
    assert cost.times.activity_s["orchestration_probe.nap"] >= 2 * NAP_S * 0.9
    assert 0 <= cost.times.workflow_task_s < cost.orchestration_s + 1e-6


def test_a_run_directory_is_read_from_a_copy_of_its_database(tmp_path):
    """The CLI path: a dev server on a copy of the run's temporal.db, which stays untouched."""
    async def record_a_run() -> None:
        endpoint = await start_dev_server(TemporalConfig(port=0, ui_port=0), tmp_path)
        try:
            await probe(endpoint.address, "orch-dir")
        finally:
            stop_dev_server(endpoint)

    asyncio.run(record_a_run())
    (tmp_path / "run.json").write_bytes(orjson.dumps({"run_id": "orch-dir"}))
    (tmp_path / "config.json").write_bytes(orjson.dumps({"temporal": {"namespace": "default"}}))
    before = (tmp_path / "temporal.db").stat().st_mtime_ns
    costs = asyncio.run(costs_of_run_dir(tmp_path, limit=None, workflow_type="OrchestrationProbe"))
    assert [c.times.activities for c in costs] == [2]
    assert (tmp_path / "temporal.db").stat().st_mtime_ns == before


def fake_cost(n: int, wall_s: float, inside_s: float, queue_s: float, activities: int) -> AttemptCost:
    times = HistoryTimes(close="completed", wall_s=wall_s, inside_s=inside_s, queue_s=queue_s,
                         workflow_task_s=wall_s - inside_s - queue_s, workflow_tasks=activities + 1,
                         activities=activities)
    return AttemptCost(workflow_id=f"r.snapshot.{n}.1", trigger="periodic", outcome="published",
                       started=None, times=times)


def test_the_table_has_percentiles_over_attempts_and_the_notes_say_where_time_goes():
    costs = [fake_cost(1, 1.0, 0.9, 0.06, 5), fake_cost(2, 2.0, 1.8, 0.1, 5), fake_cost(3, 0.1, 0.0, 0.0, 0)]
    result = result_of(costs)
    assert result.name == "orchestration"
    assert "| orchestration per activity | 2 |" in result.table  # the attempt without activities is left out
    summary = result.data["summary"]
    assert summary["orchestration (wall - inside)"]["max_s"] == pytest.approx(0.2)
    assert summary["orchestration per activity"]["median_s"] == pytest.approx(0.03)
    assert len(result.data["attempts"]) == 3 and result.data["outcomes"] == {"published": 3}
    assert "10 activities" in result.notes[0]
    assert result.notes[1].startswith("where it goes: workflow tasks")  # the biggest part comes first


def test_percentile_interpolates_between_ranks():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)
    assert percentile([4.0], 90) == 4.0
    assert percentile([1.0, 5.0, 2.0], 100) == 5.0


def test_the_controllers_local_activity_clocks_are_read_by_execution(tmp_path):
    lines = [{"kind": "train_step", "step": 1},
             {"kind": "local_activity", "activity": "data_plane.cut", "workflow_id": "w.1", "workflow_run_id": "a",
              "attempt": 1, "wall_s": 0.01, "loop_wait_s": 0.001, "run_s": 0.008},
             {"kind": "local_activity", "activity": "snapshot.publish", "workflow_id": "w.1", "workflow_run_id": "a",
              "attempt": 1, "wall_s": 0.02, "loop_wait_s": 0.001, "run_s": 0.015},
             {"kind": "local_activity", "activity": "data_plane.cut", "workflow_id": "w.1", "workflow_run_id": "b",
              "attempt": 1, "wall_s": 0.03, "loop_wait_s": 0.001, "run_s": 0.02}]
    (tmp_path / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    clocks = local_clocks_of(tmp_path)
    assert {key: [line["activity"] for line in runs] for key, runs in clocks.items()} == {
        ("w.1", "a"): ["data_plane.cut", "snapshot.publish"], ("w.1", "b"): ["data_plane.cut"]}
    assert local_clocks_of(tmp_path / "nowhere") == {}
