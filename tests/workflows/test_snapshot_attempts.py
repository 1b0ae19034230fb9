"""Snapshot attempts end to end: real Temporal dev server, real participants over HTTP,
the real controller, trainer and vLLM engine (the session's shared stack)."""

from __future__ import annotations

import asyncio
import gc
import hashlib

import orjson
import pytest

from tests.run_command import metrics
from tests.workflows.snapshot_harness import (
    StandInParticipants,
    attempt_dropped_by_its_worker,
    attempt_with_stand_ins,
    published_dirs,
    query_once_started,
    run_scenario,
    scenario_config,
    staging_dirs,
)
from turnkeep.bench.attempt_history import history_times
from turnkeep.schemas.participant import FaultPlan
from turnkeep.schemas.snapshot import SnapshotManifest

pytestmark = pytest.mark.integration


def outcomes(result) -> list[str]:
    return [line["outcome"] for line in result.snapshot_lines]


def assert_released(result) -> None:
    """Invariant 4: every hold and gate is released once the attempts are over."""
    assert result.trainer_holders == []
    assert result.controller.admission.is_clear()
    assert result.controller.deadline_holds.is_clear()
    assert result.env_health["unacked"] == 0
    assert staging_dirs(result.run_dir) == []


def test_happy_path_publishes_a_complete_verified_snapshot(stack, stack_config, temporal_address):
    cfg = scenario_config(stack_config)
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=4))

    assert "published" in outcomes(result)
    assert "failed" not in outcomes(result)
    published = [line for line in result.snapshot_lines if line["outcome"] == "published"]
    for line in published:
        assert line["trigger"] == "trainer_checkpoint"
        assert set(line["phase_s"]) >= {"preflight", "trainer_hold", "gym_prepare", "gym_commit", "cut", "publish",
                                         "resume"}
        assert line["bytes_written"] > 0 and line["reason"].startswith("published")
    snapshot_dir = published_dirs(result.run_dir)[-1]
    manifest = SnapshotManifest.model_validate_json((snapshot_dir / "manifest.json").read_bytes())
    assert manifest.anchor_step == int(snapshot_dir.parent.parent.name.removeprefix("step_"))
    assert manifest.config_fingerprint
    for artifact in manifest.artifacts:
        data = (snapshot_dir / artifact.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == artifact.sha256 and len(data) == artifact.bytes
    state = orjson.loads((snapshot_dir / "controller" / "state.json").read_bytes())
    assert state["step"] == manifest.anchor_step
    assert manifest.counts["continuations"] == len(state["continuations"])
    assert_released(result)


def test_a_parked_attempt_fences_every_policy_engine_and_publishes_all_their_artifacts():
    participants = StandInParticipants(prepare_s=0.5)
    result = asyncio.run(attempt_with_stand_ins(participants, engines=[0, 1]))

    assert result.outcome == "published", result.reason
    run_id = result.checkpoint_id.split(".")[0]
    for step in ("policy.prepare", "policy.commit", "policy.resume"):
        assert participants.policy_calls(step) == [f"{run_id}.policy.0", f"{run_id}.policy.1"], step
    assert participants.policy_calls("policy.abort") == []
    published = participants.published
    assert {a.path for a in published.artifacts} == {
        "env/agents.jsonl", f"{run_id}.policy.0/state.json", f"{run_id}.policy.1/state.json"}
    assert published.counts["policy_version"] == 7 and published.counts["parked_agents"] == 2
    # Side by side: each step's engines count once (the slowest), on the phase clock as in participant seconds.
    assert result.participant_s == pytest.approx(0.1 * 6)
    assert 0.5 <= result.phase_s["gym_prepare"] < 0.9, result.phase_s


def test_engines_at_different_policy_versions_fail_the_attempt_and_every_engine_aborts():
    participants = StandInParticipants(policy_versions={0: 7, 1: 8})
    result = asyncio.run(attempt_with_stand_ins(participants, engines=[0, 1]))

    assert result.outcome == "failed", result.reason
    assert "engine 0 at policy version 7" in result.reason and "engine 1 at policy version 8" in result.reason
    assert participants.published is None
    run_id = result.checkpoint_id.split(".")[0]
    assert participants.policy_calls("policy.abort") == [f"{run_id}.policy.0", f"{run_id}.policy.1"]
    assert participants.policy_calls("policy.resume") == []
    assert ("snapshot.discard_staging", f"{run_id}.controller") in participants.calls


def test_an_attempt_from_before_engines_uses_the_one_policy_servers_queue():
    participants = StandInParticipants()
    result = asyncio.run(attempt_with_stand_ins(participants, engines=None))

    assert result.outcome == "published", result.reason
    run_id = result.checkpoint_id.split(".")[0]
    for step in ("policy.prepare", "policy.commit", "policy.resume"):
        assert participants.policy_calls(step) == [f"{run_id}.policy"], step


def test_a_step_finishing_during_a_slow_prepare_waits_and_the_attempt_lands(stack, stack_config, temporal_address):
    """The peer's case: the Gym phase (3 s) is longer than a train step (about 1 s here). The moment is pinned: the
    operator's attempt is asked for only once the groups of the step after its checkpoint are finished, so that
    step is ready while the attempt prepares and waits on the hold (at a checkpoint taken on its own, whether they
    are finished is timing: the file run alone once found them unfinished and the trainer never waited)."""
    from turnkeep.schemas.snapshot import SnapshotNowSignal
    from turnkeep.workflows.run_workflow import RunWorkflow

    async def snapshot_when_the_next_step_is_ready(snapshots, controller):
        per_step = controller.cfg.train.prompts_per_step
        # Complete groups: at most a step's batch being trained, and a whole batch more.
        while len(controller.ledger.complete_group_ids()) < 2 * per_step:
            await asyncio.sleep(0.02)
        await snapshots.handle.signal(RunWorkflow.snapshot_now, SnapshotNowSignal(reason="the next step is ready"))
        await _until_outcome(snapshots, lambda r: r.trigger == "operator")
        # The held step ends after the attempt released the hold; the scenario stops once its line is written (the
        # pump's step count moves before its refit, and the line is written after it).
        held = controller.training.checkpointed_step + 1
        while not [line for line in metrics(controller.cfg.run.run_dir, "train_step") if line["step"] >= held]:
            await asyncio.sleep(0.05)

    cfg = scenario_config(stack_config)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"save_period": 1000})})
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=None,
                                      during=snapshot_when_the_next_step_is_ready,
                                      env_faults=FaultPlan(delay_s={"prepare": 3.0})))
    published = [line for line in result.snapshot_lines if line["outcome"] == "published"]
    assert published, outcomes(result)
    assert not [line for line in result.snapshot_lines if "trainer" in line["reason"] and line["outcome"] == "skipped"]
    assert max(line["trainer_wait_s"] for line in published) > 1.0, result.snapshot_lines
    assert max(line["trainer_hold_wait_s"] for line in result.step_lines) > 1.0
    assert_released(result)


async def _first_attempt_ended(snapshots, controller) -> None:
    """Train until an attempt has ended: a fixed number of steps may all pass before the first checkpoint's attempt
    ends (a fresh-clone run with another whole run beside it stopped after 2 steps with no attempt line)."""
    await _until_outcome(snapshots, lambda result: True, timeout_s=240)


def test_one_http_500_on_commit_is_retried_and_publishes(stack, stack_config, temporal_address):
    cfg = scenario_config(stack_config)
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=None, during=_first_attempt_ended,
                                      env_faults=FaultPlan(fail={"commit": 1})))
    assert outcomes(result)[0] == "published"
    assert_released(result)


def test_a_resume_that_fails_once_is_retried(stack, stack_config, temporal_address):
    cfg = scenario_config(stack_config)
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=None, during=_first_attempt_ended,
                                      policy_faults=FaultPlan(fail={"resume": 1})))
    assert outcomes(result)[0] == "published"
    assert_released(result)


def test_a_parked_rollout_longer_than_its_budget_is_not_timed_out(stack, stack_config, temporal_address):
    from turnkeep.schemas.snapshot import SnapshotNowSignal
    from turnkeep.workflows.run_workflow import RunWorkflow

    async def snapshot_until_agents_were_parked(snapshots, controller):
        # Whether agents are mid-rollout at a given instant is timing; ask until one attempt parked some.
        for number in range(8):
            await snapshots.handle.signal(RunWorkflow.snapshot_now, SnapshotNowSignal(reason=f"park #{number}"))
            status = await _until_outcome(snapshots, lambda r: r.trigger == "operator" and r.checkpoint_id not in seen)
            seen.add(status.last_result.checkpoint_id)
            if status.last_result.parked_agents > 0:
                return

    seen: set[str] = set()
    # The park (prepare delayed 12 s) is half again the budget, and the budget is far above a rollout's own running
    # time even on a loaded machine (a 2 s budget there timed out rollouts that had merely run slowly). Slow tools
    # and a small window keep generation behind training, so agents are mid-rollout when the trainer is held (with
    # generation ahead, every agent finished before admission closed and nothing was parked).
    cfg = scenario_config(stack_config, rollout={"rollout_timeout_s": 8.0, "max_inflight_groups": 8})
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"save_period": 1000})})
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=None, during=snapshot_until_agents_were_parked,
                                      env_faults=FaultPlan(delay_s={"prepare": 12.0}, tool_delay_s={"calc": 0.3})))
    parked = [line for line in result.snapshot_lines if line["parked_agents"] > 0]
    assert parked, result.snapshot_lines
    assert parked[0]["outcome"] == "published"
    assert parked[0]["admission_closed_s"] > cfg.rollout.rollout_timeout_s
    assert result.controller.stats.siblings_dropped == {}
    assert result.controller.stats.retries == 0
    assert_released(result)

async def _wait_for_phase(snapshots, phase: str):
    from turnkeep.workflows.run_workflow import RunWorkflow

    while True:
        status = await snapshots.handle.query(RunWorkflow.status)
        if status.running_attempt:
            child = snapshots.client.get_workflow_handle(status.running_attempt)
            if await query_once_started(child, "phase") == phase:
                return child
        await asyncio.sleep(0.05)


def test_cancel_in_the_middle_of_prepare_aborts_with_compensation(stack, stack_config, temporal_address):
    async def cancel_during_prepare(snapshots, controller):
        child = await _wait_for_phase(snapshots, "gym_prepare")
        await asyncio.sleep(0.5)
        await child.cancel()  # what `temporal workflow cancel --workflow-id <id>` does

    cfg = scenario_config(stack_config)
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=2, during=cancel_during_prepare,
                                      env_faults=FaultPlan(delay_s={"prepare": 8.0})))
    first = result.snapshot_lines[0]
    assert first["outcome"] == "aborted", first
    assert "compensate" in first["phase_s"]
    assert result.env_health["boundary_holders"] == []  # Gym is running again
    assert_released(result)


def test_a_killed_controller_worker_is_replaced_and_the_attempt_ends_from_history(
    stack, stack_config, temporal_address
):
    from turnkeep.workers.temporal.controller_worker import controller_worker

    async def kill_worker_during_prepare(snapshots, controller):
        await _wait_for_phase(snapshots, "gym_prepare")
        await asyncio.sleep(0.5)
        snapshots.worker_task.cancel()  # the worker dies with the attempt in flight
        await asyncio.gather(snapshots.worker_task, return_exceptions=True)
        snapshots.worker, snapshots.worker_task = controller_worker(snapshots.client, snapshots.ctx)

    cfg = scenario_config(stack_config)
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=2, during=kill_worker_during_prepare,
                                      env_faults=FaultPlan(delay_s={"prepare": 3.0})))
    first = result.snapshot_lines[0]
    assert first["outcome"] in ("published", "failed", "aborted"), first
    assert first["reason"]
    assert_released(result)


async def _until_outcome(snapshots, predicate, timeout_s: float = 90.0):
    from turnkeep.workflows.run_workflow import RunWorkflow

    async def poll():
        while True:
            status = await snapshots.handle.query(RunWorkflow.status)
            if status.last_result is not None and predicate(status.last_result):
                return status
            await asyncio.sleep(0.1)

    return await asyncio.wait_for(poll(), timeout_s)


def test_periodic_attempts_get_a_checkpoint_on_demand_and_publish(stack, stack_config, temporal_address):
    async def until_periodic_published(snapshots, controller):
        await _until_outcome(snapshots, lambda r: r.trigger == "periodic" and r.outcome == "published")

    cfg = scenario_config(stack_config, attempt_interval_s=1.0)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"save_period": 1000})})
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=None, during=until_periodic_published))
    periodic = [line for line in result.snapshot_lines if line["trigger"] == "periodic"]
    assert periodic and periodic[0]["outcome"] == "published", result.snapshot_lines
    assert_released(result)


def test_operators_pause_resume_snapshot_now_and_query_status(stack, stack_config, temporal_address):
    from turnkeep.schemas.snapshot import SnapshotNowSignal
    from turnkeep.workflows.run_workflow import RunWorkflow

    statuses = []

    async def operate(snapshots, controller):
        await snapshots.handle.signal(RunWorkflow.pause_snapshots)
        while not (status := await snapshots.handle.query(RunWorkflow.status)).paused:
            await asyncio.sleep(0.05)  # a signal lands with the workflow's next task
        statuses.append(status)
        await snapshots.handle.signal(RunWorkflow.snapshot_now, SnapshotNowSignal(reason="before maintenance"))
        await _until_outcome(snapshots, lambda r: r.trigger == "operator")
        await snapshots.handle.signal(RunWorkflow.resume_snapshots)
        while (status := await snapshots.handle.query(RunWorkflow.status)).paused:
            await asyncio.sleep(0.05)
        statuses.append(status)

    cfg = scenario_config(stack_config, attempt_interval_s=1.0)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"save_period": 1000})})
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=None, during=operate))
    assert statuses[0].paused and not statuses[-1].paused
    first = result.snapshot_lines[0]
    assert first["trigger"] == "operator" and first["outcome"] == "published", first
    assert_released(result)


async def _forever(snapshots, controller):
    await asyncio.sleep(600)


def test_failed_attempts_in_a_row_stop_the_run_with_a_clear_message(stack, stack_config, temporal_address):
    from turnkeep.controller.errors import RunStopped

    cfg = scenario_config(stack_config, attempt_interval_s=0.5, max_consecutive_failures=2)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"save_period": 1000})})
    with pytest.raises(RunStopped, match="2 snapshot attempts failed in a row") as stopped:
        asyncio.run(run_scenario(stack, temporal_address, cfg, steps=None, during=_forever,
                                 env_faults=FaultPlan(fail={"commit": 1000})))
    assert "snapshot.max_consecutive_failures" in str(stopped.value)


def test_a_resume_that_keeps_failing_is_published_release_pending_then_released(
    stack, stack_config, temporal_address
):
    cfg = scenario_config(stack_config)
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=2,
                                      policy_faults=FaultPlan(fail={"resume": 4})))
    first = result.snapshot_lines[0]
    assert first["outcome"] == "published_release_pending", first
    assert first["snapshot_dir"] and "release failed" in first["reason"]
    assert_released(result)  # the run workflow kept retrying the release until it went through


def test_a_journal_snapshot_stops_nothing_and_names_the_journal_positions(stack, stack_config, temporal_address):
    """`snapshot.agents = "journal"`: no attempt closes admission, suspends deadlines, parks or fences anything;
    each published snapshot's state names the environment server's turn journal position and the agents running
    at its cut."""
    from turnkeep.schemas.names import checkpoint_holder, snapshot_holder
    from turnkeep.schemas.snapshot import SnapshotNowSignal
    from turnkeep.workflows.run_workflow import RunWorkflow

    closed_by_snapshots: set[str] = set()

    async def snapshot_while_watching_the_gates(snapshots, controller):
        async def watch():
            while True:
                for holds in (controller.admission, controller.deadline_holds):
                    closed_by_snapshots.update(h for h in holds.holders() if h.startswith("snapshot:"))
                await asyncio.sleep(0.002)

        watcher = asyncio.ensure_future(watch())
        try:
            # Slow tools keep agents mid-rollout; still, up to 12 tries, as a cut can find no agent running. A new
            # attempt is told by its id: a skipped one ("nothing changed") repeats the last one's reason.
            for number in range(12):
                await snapshots.handle.signal(RunWorkflow.snapshot_now, SnapshotNowSignal(reason=f"journal #{number}"))
                status = await _until_outcome(snapshots,
                                              lambda r: r.checkpoint_id not in seen and r.trigger == "operator")
                seen.add(status.last_result.checkpoint_id)
                if status.last_result.outcome == "published":
                    handle = snapshots.client.get_workflow_handle(status.last_result.checkpoint_id)
                    histories.append(history_times((await handle.fetch_history()).events))
                    # Whoever held the trainer for it let go before the attempt ended (not at the run's stop).
                    anchor_holders = {checkpoint_holder(status.last_result.anchor_step),
                                      snapshot_holder(status.last_result.checkpoint_id)}
                    held_after.update(anchor_holders & set(await snapshots.ctx.trainer.hold_holders.remote()))
                if status.last_result.journaled_agents > 0 and number >= 1:
                    return
        finally:
            watcher.cancel()

    seen: set[str] = set()
    histories: list = []
    held_after: set[str] = set()
    cfg = scenario_config(stack_config, agents="journal", rollout={"max_inflight_groups": 24})
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=None,
                                      during=snapshot_while_watching_the_gates,
                                      env_faults=FaultPlan(tool_delay_s={"calc": 0.3})))
    published = [line for line in result.snapshot_lines if line["outcome"] == "published"]
    assert len(published) >= 2, result.snapshot_lines
    assert closed_by_snapshots == set() and held_after == set()
    for line in published:
        assert "gym_mark" in line["phase_s"] and "cut" in line["phase_s"]
        assert not {"gym_prepare", "gym_commit", "resume"} & set(line["phase_s"]), line["phase_s"]
        assert line["admission_closed_s"] == 0 and line["parked_agents"] == 0
    assert max(line["journaled_agents"] for line in published) > 0
    # The controller's phases ran as local activities. At a trainer checkpoint the attempt kept the train pump's
    # hold and its cut released it: nothing ran on the trainer's queue and the whole attempt was one workflow task.
    # Otherwise it took its own hold there: 3 workflow tasks (start, after the hold, after the release).
    assert histories
    kept = 0
    for times in histories:
        assert {"gym.mark", "data_plane.cut", "snapshot.publish", "snapshot.preflight"} <= set(times.activity_s)
        if "trainer.hold" not in times.activity_s:
            kept += 1
            assert "trainer.release" not in times.activity_s, times
            assert (times.activities, times.local_activities, times.workflow_tasks) == (5, 5, 1), times
        else:
            assert (times.activities, times.local_activities, times.workflow_tasks) == (7, 5, 3), times
    assert kept >= 1, histories
    positions = []
    for snapshot_dir in published_dirs(result.run_dir):
        manifest = SnapshotManifest.model_validate_json((snapshot_dir / "manifest.json").read_bytes())
        state = orjson.loads((snapshot_dir / "controller" / "state.json").read_bytes())
        assert state["agents_from"] == "journal" and state["continuations"] == []
        [mark] = state["turn_journals"]
        assert mark["name"] == "env" and mark["checkpoint_id"] == manifest.checkpoint_id and mark["seq"] >= 0
        positions.append(mark["seq"])
        assert not (snapshot_dir / "env").exists()  # nothing was saved by the environment server
        assert manifest.counts["journaled_agents"] >= 0
    # A cut taken before any agent committed a turn names position 0; a later one names the turns since.
    assert max(positions) > 0, positions
    assert_released(result)


def test_an_attempt_dropped_by_its_worker_mid_activity_closes_without_a_traceback(monkeypatch):
    """A stopping run's worker (or one replaced after its Temporal server came back) drops the instances it holds.
    Their coroutines are closed later, outside any workflow event loop: cleanup there must not call the workflow."""
    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    asyncio.run(attempt_dropped_by_its_worker(StandInParticipants(prepare_s=30), [0, 1], "policy.prepare"))
    gc.collect()
    assert [f"{u.exc_type.__name__}: {u.exc_value} in {u.object}" for u in unraisable] == []
