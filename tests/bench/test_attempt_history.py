import orjson
import pytest
from temporalio.api.enums.v1 import EventType as E
from temporalio.api.history.v1 import HistoryEvent

from turnkeep.bench.attempt_history import add_local_clocks, history_times


def event(event_id: int, kind: E, at_s: float, **attributes) -> HistoryEvent:
    ev = HistoryEvent(event_id=event_id, event_type=kind, **attributes)
    ev.event_time.FromNanoseconds(int(round(at_s * 1e9)))
    return ev


def scheduled(event_id, at_s, name):
    return event(event_id, E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, at_s,
                 activity_task_scheduled_event_attributes={"activity_type": {"name": name}})


def started(event_id, at_s, scheduled_id, attempt=1):
    return event(event_id, E.EVENT_TYPE_ACTIVITY_TASK_STARTED, at_s,
                 activity_task_started_event_attributes={"scheduled_event_id": scheduled_id, "attempt": attempt})


def task(event_id, scheduled_at, completed_at):
    """A workflow task that waits 2 ms for a worker and runs for the rest."""
    return [event(event_id, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, scheduled_at),
            event(event_id + 1, E.EVENT_TYPE_WORKFLOW_TASK_STARTED, scheduled_at + 0.002,
                  workflow_task_started_event_attributes={"scheduled_event_id": event_id}),
            event(event_id + 2, E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, completed_at,
                  workflow_task_completed_event_attributes={"scheduled_event_id": event_id})]


def a_history() -> list[HistoryEvent]:
    """Three sequential activities: one plain, one retried (only its last start is recorded),
    one cancelled before a worker took it; the workflow tasks between them take 10 ms each."""
    return [
        event(1, E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 100.0),
        *task(2, 100.0, 100.010),
        scheduled(5, 100.010, "gym.prepare"),
        started(6, 100.012, 5),
        event(7, E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, 100.112,
              activity_task_completed_event_attributes={"scheduled_event_id": 5}),
        *task(8, 100.112, 100.122),
        scheduled(11, 100.122, "gym.commit"),
        started(12, 100.422, 11, attempt=2),  # 300 ms of a failed first attempt and backoff
        event(13, E.EVENT_TYPE_ACTIVITY_TASK_FAILED, 100.472,
              activity_task_failed_event_attributes={"scheduled_event_id": 11}),
        *task(14, 100.472, 100.482),
        scheduled(17, 100.482, "gym.abort"),
        event(18, E.EVENT_TYPE_ACTIVITY_TASK_CANCELED, 100.487,
              activity_task_canceled_event_attributes={"scheduled_event_id": 17}),
        *task(19, 100.487, 100.497),
        event(22, E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED, 100.497),
    ]


def test_wall_time_splits_into_inside_queue_retries_and_workflow_tasks():
    times = history_times(a_history())
    assert times.close == "failed"
    assert times.wall_s == pytest.approx(0.497)
    assert times.inside_s == pytest.approx(0.100 + 0.050)
    assert times.queue_s == pytest.approx(0.002 + 0.005)  # the cancelled one waited its whole life
    assert times.retry_s == pytest.approx(0.300)
    assert times.workflow_task_s == pytest.approx(0.040)
    assert times.workflow_task_wait_s == pytest.approx(0.008)
    assert times.workflow_tasks == 4
    assert (times.activities, times.retried_activities) == (3, 1)
    assert times.activity_s == pytest.approx({"gym.prepare": 0.100, "gym.commit": 0.050})
    # Nothing unaccounted: every moment is inside, queued, retried or in a workflow task.
    assert times.wall_s - times.inside_s == pytest.approx(times.queue_s + times.retry_s + times.workflow_task_s)


def test_an_execution_without_a_close_event_is_refused():
    with pytest.raises(ValueError, match="still running"):
        history_times(a_history()[:-1])


def local_marker(event_id, at_s, name, scheduled_at, completed_at):
    def stamp(t):
        return {"seconds": int(t), "nanos": int(round((t - int(t)) * 1e9))}

    data = orjson.dumps({"seq": 1, "attempt": 1, "activity_type": name, "original_schedule_time": stamp(scheduled_at),
                         "complete_time": stamp(completed_at)})
    return event(event_id, E.EVENT_TYPE_MARKER_RECORDED, at_s, marker_recorded_event_attributes={
        "marker_name": "core_local_activity", "details": {"data": {"payloads": [{"data": data}]}}})


def test_a_local_activity_counts_as_inside_time_not_as_its_workflow_task():
    """Two local activities (80 ms and 30 ms) run inside one 120 ms workflow task; a patch marker is no activity."""
    history = [
        event(1, E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 100.0),
        *task(2, 100.0, 100.120),
        event(5, E.EVENT_TYPE_MARKER_RECORDED, 100.120,
              marker_recorded_event_attributes={"marker_name": "core_patch", "details": {}}),
        local_marker(6, 100.120, "data_plane.cut", 100.003, 100.083),
        local_marker(7, 100.120, "snapshot.publish", 100.085, 100.115),
        event(8, E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, 100.120),
    ]
    times = history_times(history)
    assert (times.activities, times.local_activities, times.workflow_tasks) == (2, 2, 1)
    assert times.inside_s == pytest.approx(0.110)
    assert times.workflow_task_s == pytest.approx(0.010)
    assert times.activity_s == pytest.approx({"data_plane.cut": 0.080, "snapshot.publish": 0.030})
    assert times.wall_s - times.inside_s == pytest.approx(times.queue_s + times.retry_s + times.workflow_task_s)


def test_a_local_activitys_own_clocks_replace_its_markers_stamps():
    """Under load a marker's completion can read before its schedule (not one clock): the markers say 0 ms here,
    the controller's clocks say the cut ran 60 ms after a 15 ms hop and the publish 20 ms after a 5 ms one."""
    history = [
        event(1, E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 100.0),
        *task(2, 100.0, 100.120),
        local_marker(6, 100.120, "data_plane.cut", 100.050, 100.010),
        local_marker(7, 100.120, "snapshot.publish", 100.060, 100.010),
        event(8, E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, 100.120),
    ]
    times = history_times(history)
    assert times.inside_s == 0 and times.workflow_task_s == pytest.approx(0.120)
    add_local_clocks(times, [{"activity": "data_plane.cut", "wall_s": 0.075, "run_s": 0.060},
                             {"activity": "snapshot.publish", "wall_s": 0.025, "run_s": 0.020}])
    assert times.local_clocked == 2
    assert times.inside_s == pytest.approx(0.080)
    assert times.local_hop_s == pytest.approx(0.020)
    assert times.workflow_task_s == pytest.approx(0.020)
    assert times.activity_s == pytest.approx({"data_plane.cut": 0.060, "snapshot.publish": 0.020})
    assert times.wall_s == pytest.approx(times.inside_s + times.local_hop_s + times.queue_s + times.workflow_task_s)


def test_local_clocks_replace_marker_time_that_was_counted_too():
    history = [
        event(1, E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 100.0),
        *task(2, 100.0, 100.120),
        local_marker(6, 100.120, "data_plane.cut", 100.003, 100.083),
        event(8, E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, 100.120),
    ]
    times = history_times(history)
    assert times.inside_s == pytest.approx(0.080)
    add_local_clocks(times, [{"activity": "data_plane.cut", "wall_s": 0.090, "run_s": 0.070}])
    assert times.inside_s == pytest.approx(0.070) and times.activity_s == pytest.approx({"data_plane.cut": 0.070})
    assert times.workflow_task_s == pytest.approx(0.030)
    add_local_clocks(times, [])  # no lines: nothing changes
    assert times.inside_s == pytest.approx(0.070)
