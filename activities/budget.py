"""How long an activity may still wait, from the timeouts Temporal gave it.

A wait that knows its end can fail with its own reason (what it still waits on) just
before Temporal would end it with a bare "activity timeout".
"""

from __future__ import annotations

from datetime import datetime, timezone

from temporalio import activity

MARGIN_FRACTION = 0.05
MIN_MARGIN_S = 0.5


def remaining_budget_s() -> float | None:
    """Seconds left before this activity's first timeout (schedule-to-close covers retries), less a margin
    for the reply to reach the workflow; None when it has no close timeout at all."""
    info = activity.info()
    ends: list[tuple[datetime, float]] = []
    if info.schedule_to_close_timeout:
        ends.append((info.scheduled_time + info.schedule_to_close_timeout,
                     info.schedule_to_close_timeout.total_seconds()))
    if info.start_to_close_timeout:
        ends.append((info.started_time + info.start_to_close_timeout, info.start_to_close_timeout.total_seconds()))
    if not ends:
        return None
    end, total_s = min(ends)
    margin_s = max(MIN_MARGIN_S, total_s * MARGIN_FRACTION)
    return max(0.0, (end - datetime.now(timezone.utc)).total_seconds() - margin_s)
