"""Small facts about a log that several checks share: when each incarnation started and was last
heard of, which events follow a restore, the cuts by their time, and the numbers inside ids.

Events of one incarnation are written by two processes (the controller and the environment
server), so their order in the file is only reliable across incarnations (the old tree is
dead before the new one starts) and among the controller's own events. Checks rely on file
order only for controller events and on `inc` and `t` for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from turnkeep.schemas.audit import CutTaken, Restored, RunStarted, ids_digest
from turnkeep.schemas.choices import CutKind
from turnkeep.schemas.recovery import SourceKind

_GROUP_INDEX = re.compile(r"g(\d+)")


def group_index(group_id: str) -> int | None:
    """The dataloader index a group id was made from (`g0000042` -> 42); None for another form."""
    match = _GROUP_INDEX.fullmatch(group_id)
    return int(match.group(1)) if match else None


def attempt_after(rollout_id: str) -> str:
    """`<group>.<sibling>.<N>` -> `<group>.<sibling>.<N+1>`: the attempt that continues or reruns it."""
    stem, attempt = rollout_id.rsplit(".", 1)
    return f"{stem}.{int(attempt) + 1}"


def group_of(rollout_id: str) -> str:
    return rollout_id.rsplit(".", 2)[0]


def last_heard(events: list) -> dict[int, float]:
    """Per incarnation, the time of its last event of any process: it lived at least until then."""
    last: dict[int, float] = {}
    for event in events:
        last[event.inc] = max(last.get(event.inc, event.t), event.t)
    return last


def started_at(events: list) -> dict[int, float]:
    """Per incarnation, when it started (`run_started`, else its first event)."""
    first: dict[int, float] = {}
    for event in events:
        first[event.inc] = min(first.get(event.inc, event.t), event.t)
    for event in events:
        if isinstance(event, RunStarted):
            first[event.inc] = event.t
    return first


def after_restores(events: list) -> Iterator[tuple[Restored, list]]:
    """Each restore with the events that follow it until the next restore or start, whatever process wrote them."""
    for index, event in enumerate(events):
        if not isinstance(event, Restored):
            continue
        following = []
        for later in events[index + 1:]:
            if isinstance(later, (Restored, RunStarted)):
                break
            if later.inc == event.inc:
                following.append(later)
        yield event, following


RUN_START = -1.0
"""The cut time that stands for a run's start: an empty state at step 0, which a fresh restart that keeps the first
incarnation's journal goes on from (the trainer's step 0 is the initial model)."""


def cuts_by_time(events: list) -> dict[float, CutTaken]:
    """Every cut by its `cut_unix_s`, the key a restore of it reports, and the run's start (when the log has it)
    under `RUN_START`."""
    cuts = {event.cut_unix_s: event for event in events if isinstance(event, CutTaken)}
    start = next((event for event in events if isinstance(event, RunStarted) and not event.resumed), None)
    if start is not None:
        cuts[RUN_START] = run_start_cut(start)
    return cuts


def run_start_cut(started: RunStarted) -> CutTaken:
    """The run's start as a cut: nothing held, the dataloader at 0."""
    return CutTaken(t=started.t, inc=started.inc, kind=CutKind.TRAINER_CHECKPOINT, step=0, cut_unix_s=RUN_START, rows=0,
                    rows_digest=ids_digest([]), groups=0, groups_digest=ids_digest([]), next_group_index=0)


def cut_of(restored: Restored, cuts: dict[float, CutTaken]) -> CutTaken | None:
    """The cut a restore brought back, when the log holds it: the run's start for a fresh one."""
    if restored.source == SourceKind.FRESH:
        return cuts.get(RUN_START)
    if restored.cut_unix_s is None:
        return None
    return cuts.get(restored.cut_unix_s)


def restored_nothing(restored: Restored) -> bool:
    """A fresh start that kept nothing: there is nothing to hold it to."""
    return restored.source == SourceKind.FRESH and restored.kept_after_cut is None
