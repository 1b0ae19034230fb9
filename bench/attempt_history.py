"""Where one workflow execution's wall time went, from the timestamps of its history events
alone: inside activities, waiting for a worker to pick an activity up, and in workflow
tasks. Pure arithmetic on `HistoryEvent`s, so it can be checked on hand-built events.

A local activity has no events of its own: it runs inside a workflow task and leaves a
marker with its schedule and completion times, which count as inside time and not as
workflow-task time. Under load those two stamps are not one clock (the completion can read
tens of ms before the schedule), so where the controller recorded each local activity's own
clocks (`workers.temporal.loop_bridge.BridgedRun`, `local_activity` lines in metrics.jsonl),
`add_local_clocks` counts by them instead."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

CLOSES = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "canceled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed_out",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: "continued_as_new",
}
ACTIVITY_CLOSES = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
}
LOCAL_ACTIVITY_MARKER = "core_local_activity"
WORKFLOW_TASK_CLOSES = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "workflow_task_completed_event_attributes",
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "workflow_task_failed_event_attributes",
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "workflow_task_timed_out_event_attributes",
}


@dataclass
class HistoryTimes:
    close: str
    """How the execution closed: `completed`, `failed`, `canceled`, ..."""
    wall_s: float
    """Close event time minus WorkflowExecutionStarted time."""
    inside_s: float = 0.0
    """Sum over activities of close minus (last attempt's) start, and over local activities of completion minus
    schedule: the time spent in activity code."""
    queue_s: float = 0.0
    """Sum over first-attempt activities of start minus schedule: dispatch latency to a worker."""
    retry_s: float = 0.0
    """Sum over retried activities of last start minus schedule: earlier attempts and backoff.
    Temporal writes only the last attempt's Started event, so this cannot be split further."""
    workflow_task_s: float = 0.0
    """Sum over workflow tasks of close minus schedule, less the local activities run inside them: workflow code
    and its task round trips."""
    workflow_task_wait_s: float = 0.0
    """The part of `workflow_task_s` before a worker took the task (schedule -> start)."""
    workflow_tasks: int = 0
    activities: int = 0
    """Every activity, local ones included."""
    local_activities: int = 0
    local_marker_s: float = 0.0
    """The markers' account of local activity time (`inside_s` holds it until `add_local_clocks` replaces it)."""
    local_clocked: int = 0
    """Local activity runs counted by their own clocks (`add_local_clocks`)."""
    local_hop_s: float = 0.0
    """Local activities' time outside their own code: handing the call to the controller's loop, waiting for that
    loop (busy with the pumps), and the answer's way back."""
    retried_activities: int = 0
    activity_s: dict[str, float] = field(default_factory=dict)
    """Inside time per activity type, summed."""


def seconds(event: HistoryEvent) -> float:
    return event.event_time.seconds + event.event_time.nanos / 1e9


def local_activity(event: HistoryEvent) -> tuple[str, float] | None:
    """(activity type, seconds from schedule to completion) of a local activity's marker; None for other markers."""
    marker = event.marker_recorded_event_attributes
    if marker.marker_name != LOCAL_ACTIVITY_MARKER or "data" not in marker.details:
        return None
    data = orjson.loads(marker.details["data"].payloads[0].data)

    def at(stamp: dict) -> float:
        return stamp["seconds"] + stamp.get("nanos", 0) / 1e9

    return data["activity_type"], max(0.0, at(data["complete_time"]) - at(data["original_schedule_time"]))


def history_times(events: Iterable[HistoryEvent]) -> HistoryTimes:
    seen = _HistoryEvents()
    for event in events:
        seen.add(event)
    if seen.started_at is None or seen.closed_at is None:
        raise ValueError("the history has no start or no close event: is the execution still running?")

    local_s = sum(seconds_inside for _, seconds_inside in seen.local)
    times = HistoryTimes(close=seen.close, wall_s=seen.closed_at - seen.started_at,
                         workflow_task_s=seen.task_s - local_s, workflow_task_wait_s=seen.task_wait_s,
                         workflow_tasks=seen.tasks, activities=len(seen.scheduled) + len(seen.local),
                         local_activities=len(seen.local), inside_s=local_s, local_marker_s=local_s)
    for name, inside in seen.local:
        times.activity_s[name] = times.activity_s.get(name, 0.0) + inside
    for sched, start, end in seen.spans:
        _add_activity(times, sched, start, end)
    return times


@dataclass
class _HistoryEvents:
    """What `history_times` needs of a history's events, gathered in one pass."""

    started_at: float | None = None
    closed_at: float | None = None
    close: str = ""
    scheduled: dict[int, HistoryEvent] = field(default_factory=dict)
    activity_started: dict[int, HistoryEvent] = field(default_factory=dict)
    spans: list[tuple[HistoryEvent, HistoryEvent | None, HistoryEvent]] = field(default_factory=list)
    """(scheduled event, started event or None, close event) of every closed activity."""
    task_scheduled: dict[int, float] = field(default_factory=dict)
    task_started: dict[int, float] = field(default_factory=dict)
    task_s: float = 0.0
    task_wait_s: float = 0.0
    tasks: int = 0
    local: list[tuple[str, float]] = field(default_factory=list)

    def add(self, event: HistoryEvent) -> None:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            self.started_at = seconds(event)
        elif kind in CLOSES:
            self.closed_at, self.close = seconds(event), CLOSES[kind]
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            self.scheduled[event.event_id] = event
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            self.activity_started[event.activity_task_started_event_attributes.scheduled_event_id] = event
        elif kind in ACTIVITY_CLOSES:
            scheduled_id = getattr(event, ACTIVITY_CLOSES[kind]).scheduled_event_id
            self.spans.append((self.scheduled[scheduled_id], self.activity_started.get(scheduled_id), event))
        elif kind == EventType.EVENT_TYPE_MARKER_RECORDED and (ran := local_activity(event)) is not None:
            self.local.append(ran)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            self.task_scheduled[event.event_id] = seconds(event)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            self.task_started[event.workflow_task_started_event_attributes.scheduled_event_id] = seconds(event)
        elif kind in WORKFLOW_TASK_CLOSES:
            self._workflow_task_closed(event, getattr(event, WORKFLOW_TASK_CLOSES[kind]).scheduled_event_id)

    def _workflow_task_closed(self, event: HistoryEvent, scheduled_id: int) -> None:
        if scheduled_id in self.task_scheduled:  # a transient task's Scheduled event may be absent
            began = self.task_scheduled[scheduled_id]
            self.tasks += 1
            self.task_s += seconds(event) - began
            self.task_wait_s += self.task_started.get(scheduled_id, began) - began


def _add_activity(times: HistoryTimes, sched: HistoryEvent, start: HistoryEvent | None, end: HistoryEvent) -> None:
    """Count one closed activity: its inside time, and its wait as queue or retry time."""
    if start is None:
        # Closed before any worker took it (cancelled, schedule-to-start timeout): all waiting.
        times.queue_s += seconds(end) - seconds(sched)
        return
    inside = seconds(end) - seconds(start)
    name = sched.activity_task_scheduled_event_attributes.activity_type.name
    times.inside_s += inside
    times.activity_s[name] = times.activity_s.get(name, 0.0) + inside
    if start.activity_task_started_event_attributes.attempt > 1:
        times.retried_activities += 1
        times.retry_s += seconds(start) - seconds(sched)
    else:
        times.queue_s += seconds(start) - seconds(sched)


def add_local_clocks(times: HistoryTimes, runs: list[dict]) -> None:
    """Count an execution's local activities by their own clocks (`local_activity` lines: `activity`, `wall_s`,
    `run_s`) instead of their markers: their code's time is inside time, the rest of their wall time a hop, and
    neither is workflow-task time."""
    if not runs:
        return
    times.inside_s -= times.local_marker_s
    times.workflow_task_s += times.local_marker_s
    for name in {run["activity"] for run in runs}:
        times.activity_s.pop(name, None)
    for run in runs:
        times.local_clocked += 1
        times.inside_s += run["run_s"]
        times.local_hop_s += run["wall_s"] - run["run_s"]
        times.workflow_task_s -= run["wall_s"]
        times.activity_s[run["activity"]] = times.activity_s.get(run["activity"], 0.0) + run["run_s"]
