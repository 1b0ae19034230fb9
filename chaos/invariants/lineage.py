"""Invariant 1: no group trained twice along one lineage of steps, none lost after a restore, none readmitted.

The final lineage is what the steps become once every restore has abandoned the branch after
its step: a group trained on an abandoned branch and again after the restore is trained once.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnkeep.chaos.invariants.results import InvariantResult
from turnkeep.chaos.invariants.timeline import restored_nothing
from turnkeep.schemas.audit import (
    GroupAdmitted,
    GroupRerun,
    GroupsDiscarded,
    Restored,
    RunEnded,
    RunStarted,
    StepTrained,
)


@dataclass
class LineageWalk:
    lineage: dict[int, tuple[int, int, list[str]]]
    """Final lineage: step -> (incarnation, event index, groups)."""
    accepted: set[int]
    """Indices of `step_trained` events that entered the lineage when they happened."""
    violations: list[str]
    checked: int


def walk_lineage(events: list) -> LineageWalk:
    lineage: dict[int, tuple[int, int, list[str]]] = {}
    accepted: set[int] = set()
    violations: list[str] = []
    checked = 0
    trained_at: dict[str, int] = {}  # group -> first step that trained it, on the lineage so far
    floor: int | None = 0  # restore step of the current incarnation (None: resumed, not restored yet)
    for index, event in enumerate(events):
        if isinstance(event, RunStarted):
            floor = None if event.resumed else 0
        elif isinstance(event, Restored):
            # The crash abandoned every step after the restored one: that branch never happened.
            for step in [s for s in lineage if s > event.step]:
                del lineage[step]
            for kept in _kept_steps(event):  # trained by the dead controller's trainer, kept with it
                if kept.step not in lineage:  # its `step_trained` line died with the controller's audit buffer
                    lineage[kept.step] = (event.inc, index, list(kept.group_ids))
            floor = event.step
            trained_at = _group_steps(lineage)
            restored_groups = {row.group_id for row in event.rows} | set(event.unfinished_groups)
            for group in sorted(restored_groups):
                checked += 1
                if group in trained_at:
                    violations.append(
                        f"group {group} restored by incarnation {event.inc} at step {event.step} "
                        f"but already trained at step {trained_at[group]}"
                    )
        elif isinstance(event, GroupAdmitted):
            if event.group_id in trained_at:
                violations.append(
                    f"group {event.group_id} admitted again by incarnation {event.inc} "
                    f"after being trained at step {trained_at[event.group_id]}"
                )
        elif isinstance(event, StepTrained):
            checked += 1
            if floor is not None and event.step <= floor:
                violations.append(
                    f"step {event.step} trained by incarnation {event.inc} at or below its restored step {floor}"
                )
            elif event.step in lineage:
                violations.append(f"step {event.step} trained twice on one lineage (incarnation {event.inc})")
            else:
                lineage[event.step] = (event.inc, index, list(event.group_ids))
                accepted.add(index)
                for group in event.group_ids:
                    trained_at.setdefault(group, event.step)
    first_step: dict[str, int] = {}
    for step in sorted(lineage):
        for group in lineage[step][2]:
            if group in first_step:
                violations.append(f"group {group} trained twice on one lineage: steps {first_step[group]} and {step}")
            else:
                first_step[group] = step
    return LineageWalk(lineage, accepted, violations, checked)


def _kept_steps(restored: Restored) -> list:
    return restored.kept_after_cut.kept_steps if restored.kept_after_cut is not None else []


def _group_steps(lineage: dict[int, tuple[int, int, list[str]]]) -> dict[str, int]:
    return {group: step for step, (_, _, groups) in sorted(lineage.items()) for group in groups}


def invariant_1(events: list, walk: LineageWalk) -> InvariantResult:
    violations = list(walk.violations)
    checked = walk.checked
    final_lineage_indices = {index for _, index, _ in walk.lineage.values()}
    restores = [i for i, e in enumerate(events) if isinstance(e, Restored)]
    last_inc = max((e.inc for e in events), default=0)
    ended_cleanly = any(isinstance(e, RunEnded) and e.inc == last_inc for e in events)
    unverifiable = 0
    for position, start in enumerate(restores):
        restored = events[start]
        if restored_nothing(restored):
            continue
        end = restores[position + 1] if position + 1 < len(restores) else len(events)
        following = events[end] if end < len(events) else None
        missing = _unaccounted_rows(events, start, end, following, walk.accepted, final_lineage_indices)
        checked += len({(row.group_id, row.sibling) for row in restored.rows})
        if following is None and not ended_cleanly:
            # Killed with no later restore to carry the rows on: nothing says where they went.
            unverifiable += len(missing)
            continue
        for group, sibling in missing:
            violations.append(
                f"row {group}/{sibling} restored by incarnation {restored.inc} at step {restored.step} "
                "was lost (never trained on the lineage, discarded, restored again or left outstanding)"
            )
    note = f"run ended by a kill: {unverifiable} rows unverifiable" if unverifiable else ""
    return InvariantResult(1, "no group trained twice, lost or readmitted", not violations, checked, violations, note)


def _unaccounted_rows(
    events: list, start: int, end: int, following: Restored | None, accepted: set[int], final: set[int],
) -> list[tuple[str, int]]:
    """Rows of `events[start]` that between it and the next restore were neither trained on a
    step that survives, discarded, carried into the next restore, nor left outstanding."""
    trained: set[str] = set()
    discarded: set[str] = set()
    outstanding: set[str] = set()
    for index in range(start + 1, end):
        event = events[index]
        if isinstance(event, StepTrained):
            survives = index in final if following is None else (index in accepted and event.step <= following.step)
            if survives:
                trained.update(event.group_ids)
        elif isinstance(event, GroupsDiscarded):
            discarded.update(event.group_ids)
        elif isinstance(event, GroupRerun):
            discarded.add(event.group_id)  # its level (or its judge) gave the group's sealed rows up on purpose
        elif isinstance(event, RunEnded):
            outstanding.update(event.outstanding_groups)
    carried = {(row.group_id, row.sibling) for row in following.rows} if following is not None else set()
    if following is not None:
        trained.update(group for kept in _kept_steps(following) for group in kept.group_ids)
    rows = sorted({(row.group_id, row.sibling) for row in events[start].rows})
    return [
        (group, sibling) for group, sibling in rows
        if group not in trained and group not in discarded and (group, sibling) not in carried
        and (following is not None or group not in outstanding)
    ]
