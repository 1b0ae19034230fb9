"""Invariant 7: every admitted group ends exactly one way, the dataloader skips no index, and
every row sealed before a cut is in that cut.

The walk rebuilds, from the controller's own events in file order, what its state must hold at
every moment: the rows sealed and not yet trained, discarded or thrown away by a rerun; the
groups admitted (or restored) and not yet trained or discarded; the dataloader's next index.
It starts empty at a new run and from a restore's lists at a restore, and it is compared with
what the controller saved or said: each cut (`cut_taken`: counts and digests), each restore
against the cut it brought back, and the groups `run_ended` leaves outstanding.

Each check returns its own row: `rows_in_cuts` (a), `groups_end_once` (b), `dataloader_contiguous` (c).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from turnkeep.chaos.invariants.results import InvariantResult, joined, not_checked
from turnkeep.chaos.invariants.timeline import (
    RUN_START,
    cut_of,
    cuts_by_time,
    group_index,
    restored_nothing,
)
from turnkeep.schemas.audit import (
    CutTaken,
    GroupAdmitted,
    GroupDropped,
    GroupRerun,
    GroupsDiscarded,
    Restored,
    RunEnded,
    RunStarted,
    SiblingSealed,
    StepTrained,
    ids_digest,
    row_key,
)

ROWS = "every sealed row is in the next cut"
GROUPS = "every admitted group ends exactly once"
DATALOADER = "the dataloader skips no index"


@dataclass
class _Live:
    """What the controller of one incarnation must hold now, by its events."""

    inc: int
    known: bool
    """False between a restart and its restore: nothing is known until the restore says."""
    rows: dict[str, set[int]] = field(default_factory=dict)
    groups: set[str] = field(default_factory=set)
    next_index: int | None = None

    def copy(self) -> _Live:
        """What it holds now, apart from what the walk changes next."""
        return _Live(self.inc, self.known, {g: set(s) for g, s in self.rows.items()}, set(self.groups), self.next_index)

    def row_keys(self) -> list[str]:
        return [row_key(group, sibling) for group, siblings in self.rows.items() for sibling in siblings]


@dataclass
class _Findings:
    rows: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    dataloader: list[str] = field(default_factory=list)
    cuts_checked: int = 0
    restores_checked: int = 0
    restores_unmatched: int = 0
    group_ends: int = 0
    ends_compared: int = 0
    admissions: int = 0
    unindexed: int = 0
    unseen_rows: int = 0
    """Rows a restore kept past its cut whose seal is not in the audit log (written within a flush of a kill)."""
    unseen_admissions: int = 0
    """Groups a restore kept past its cut, open, whose admission is not in the audit log (the same way)."""


def invariant_7(events: list) -> list[InvariantResult]:
    found = _walk(events)
    cuts = any(isinstance(e, CutTaken) for e in events)
    unmatched = f"{found.restores_unmatched} restores whose cut is not in the log" if found.restores_unmatched else ""
    no_cuts = "" if cuts else "cuts not checked: no cut_taken events in this log"
    unseen = f"{found.unseen_rows} rows kept past a cut whose seal the audit log lacks" if found.unseen_rows else ""
    if cuts:
        rows = InvariantResult(7, ROWS, not found.rows, found.cuts_checked + found.restores_checked, found.rows,
                               joined(unmatched, unseen))
    else:
        rows = not_checked(7, ROWS, "cut_taken")
    groups = InvariantResult(
        7, GROUPS, not found.groups, found.group_ends + found.ends_compared + found.cuts_checked, found.groups,
        joined(no_cuts, unmatched if cuts else ""),
    )
    unindexed = f"{found.unindexed} group ids without a dataloader index" if found.unindexed else ""
    unseen_admissions = (f"{found.unseen_admissions} groups kept open past a cut whose admission the audit log lacks"
                         if found.unseen_admissions else "")
    dataloader = InvariantResult(
        7, DATALOADER, not found.dataloader, found.admissions + found.restores_checked + found.cuts_checked,
        found.dataloader, joined(unindexed, no_cuts, unseen_admissions),
    )
    return [rows, groups, dataloader]


def _walk(events: list) -> _Findings:
    found = _Findings()
    cuts = cuts_by_time(events)
    live = _Live(inc=0, known=False)
    highest_admitted = -1  # over every branch: a restore cannot start past what was ever handed out
    at_cut: dict[float, tuple[int, _Live]] = {}  # cut time -> (its index in the log, what the events said it held)
    # (incarnation, cut time) -> (index, what it brought back): a later restore of the same cut may go on from there
    kept: dict[tuple[int, float], tuple[int, _Live]] = {}
    for index, event in enumerate(events):
        if isinstance(event, RunStarted):
            live = _Live(event.inc, known=not event.resumed, next_index=None if event.resumed else 0)
            if not event.resumed:
                at_cut[RUN_START] = (index, live.copy())  # what a fresh restart that keeps the first journal holds to
            continue
        if event.inc != live.inc:
            continue  # the environment server's events, or a stray line of a dead incarnation
        if isinstance(event, Restored):
            cut = cut_of(event, cuts)
            if event.kept_after_cut is not None and cut is not None and cut.cut_unix_s in at_cut:
                _restore_past_cut(event, cut, _went_on_from(event, cut, at_cut, kept, found), events, found)
                highest_admitted = _restore(event, None, live, found, highest_admitted, checked=True)
            else:
                highest_admitted = _restore(event, cut, live, found, highest_admitted)
            live = _Live(event.inc, True, _rows_of(event), set(event.unfinished_groups), event.next_group_index)
            if event.kept_after_cut is not None and cut is not None:
                kept[(event.inc, cut.cut_unix_s)] = (index, live.copy())
        elif isinstance(event, GroupAdmitted):
            highest_admitted = max(highest_admitted, _admit(event, live, found))
        elif isinstance(event, SiblingSealed):
            live.rows.setdefault(event.group_id, set()).add(event.sibling)
        elif isinstance(event, (StepTrained, GroupsDiscarded)):
            _end_groups(event, live, found)
        elif isinstance(event, (GroupRerun, GroupDropped)):
            live.rows.pop(event.group_id, None)  # its sealed rows are thrown away; the group goes on (or is discarded)
        elif isinstance(event, CutTaken) and live.known:
            at_cut[event.cut_unix_s] = (index, live.copy())
            found.cuts_checked += 1
            _compare(f"{event.kind} cut at step {event.step} (incarnation {event.inc})", event, live, found)
        elif isinstance(event, RunEnded) and live.known:
            _run_ended(event, live, found)
    return found


def _rows_of(restored: Restored) -> dict[str, set[int]]:
    rows: dict[str, set[int]] = {}
    for row in restored.rows:
        rows.setdefault(row.group_id, set()).add(row.sibling)
    return rows


def _admit(event: GroupAdmitted, live: _Live, found: _Findings) -> int:
    found.admissions += 1
    if live.known and event.group_id in live.groups:
        found.groups.append(f"group {event.group_id} admitted again by incarnation {event.inc} while it was open")
    live.groups.add(event.group_id)
    index = group_index(event.group_id)
    if index is None:
        found.unindexed += 1
        live.next_index = None
        return -1
    expected = live.next_index
    if expected is not None and index > expected:
        skipped = f"index {expected}" if index == expected + 1 else f"indices {expected} to {index - 1}"
        found.dataloader.append(f"incarnation {event.inc} admitted {event.group_id} when the dataloader was at "
                                f"index {expected}: {skipped} skipped")
    elif expected is not None and index < expected:
        found.dataloader.append(f"incarnation {event.inc} admitted {event.group_id} when the dataloader was at "
                                f"index {expected}: index {index} handed out again")
    live.next_index = index + 1
    return index


def _end_groups(event: StepTrained | GroupsDiscarded, live: _Live, found: _Findings) -> None:
    how = f"trained at step {event.step}" if isinstance(event, StepTrained) else f"discarded ({event.reason})"
    for group in dict.fromkeys(event.group_ids):
        found.group_ends += 1
        if live.known and group not in live.groups:
            found.groups.append(f"group {group} {how} by incarnation {event.inc}, but it was not open "
                                "(never admitted or restored, or it had ended already)")
        live.groups.discard(group)
        live.rows.pop(group, None)


def _compare(what: str, cut: CutTaken, live: _Live, found: _Findings) -> None:
    """The state a cut recorded against what the events say it must hold."""
    if gap := _gap(cut.rows, cut.rows_digest, live.row_keys(), "rows"):
        found.rows.append(f"{what} holds {cut.rows} rows; {len(live.row_keys())} were sealed before it and not "
                          f"trained, discarded or rerun: {gap}")
    if gap := _gap(cut.groups, cut.groups_digest, live.groups, "groups"):
        found.groups.append(f"{what} holds {cut.groups} unfinished groups; {len(live.groups)} were admitted or "
                            f"restored and not trained or discarded: {gap}")
    if live.next_index is not None and cut.next_group_index != live.next_index:
        found.dataloader.append(f"{what} saved dataloader index {cut.next_group_index}, but the groups admitted "
                                f"before it reach index {live.next_index - 1}: "
                                f"{_moved(cut.next_group_index, live.next_index)}")


def _gap(recorded: int, digest: str, expected: list[str] | set[str], things: str) -> str | None:
    """None when the recorded count and digest are those of `expected`; else how they differ."""
    return _differ(recorded, digest, len(expected), ids_digest(expected), things)


def _differ(recorded: int, digest: str, expected: int, expected_digest: str, things: str) -> str | None:
    if (recorded, digest) == (expected, expected_digest):
        return None
    if recorded < expected:
        return f"{expected - recorded} {things} missing"
    if recorded > expected:
        return f"{recorded - expected} {things} too many"
    return f"as many {things}, but not the same ones"


def _moved(recorded: int, expected: int) -> str:
    if recorded > expected:
        return f"{recorded - expected} indices would be skipped"
    return f"{expected - recorded} indices would be handed out again"


def _restore(restored: Restored, cut: CutTaken | None, live: _Live, found: _Findings, highest_admitted: int,
             checked: bool = False) -> int:
    """Checks the restore's state against its cut; returns the highest dataloader index handed out so far."""
    if restored_nothing(restored):
        return highest_admitted
    what = f"restore of incarnation {restored.inc} at step {restored.step}"
    if checked:
        pass  # against its cut and the journal after it: `_restore_past_cut`
    elif cut is None:
        found.restores_unmatched += 1
    else:
        # What the cut held is what the restore must bring back.
        found.restores_checked += 1
        held = f"its {cut.kind} cut at step {cut.step} held"
        rows = [row_key(r.group_id, r.sibling) for r in restored.rows]
        if gap := _differ(len(rows), ids_digest(rows), cut.rows, cut.rows_digest, "rows"):
            found.rows.append(f"{what} brought back {len(rows)} rows; {held} {cut.rows}: {gap}")
        groups = set(restored.unfinished_groups)
        if gap := _differ(len(groups), ids_digest(groups), cut.groups, cut.groups_digest, "groups"):
            found.groups.append(f"{what} brought back {len(groups)} unfinished groups; {held} {cut.groups}: {gap}")
        if restored.next_group_index != cut.next_group_index:
            moved = _moved(restored.next_group_index, cut.next_group_index)
            found.dataloader.append(f"{what} put the dataloader at index {restored.next_group_index}; {held} "
                                    f"{cut.next_group_index}: {moved}")
    position = restored.next_group_index
    restored_groups = set(restored.unfinished_groups) | {r.group_id for r in restored.rows}
    if position > highest_admitted + 1:
        # Kept past its cut, the restore may hold groups admitted within the audit log's flush of the kill: each
        # index it passes that the log never saw admitted must be a group it holds open.
        # So is one whose cut the log lacks (its `cut_taken` line lost in the kill).
        past_cut = restored.kept_after_cut is not None
        held = {group_index(g) for g in restored_groups} if past_cut else set()
        skipped = [index for index in range(highest_admitted + 1, position) if index not in held]
        found.unseen_admissions += position - highest_admitted - 1 - len(skipped)
        if skipped:
            held_open = f" and {len(skipped)} of the indices between are not open in it" if past_cut else ""
            found.dataloader.append(f"{what} put the dataloader at index {position}, but no group past index "
                                    f"{highest_admitted} was ever admitted{held_open}: {len(skipped)} skipped")
        highest_admitted = position - 1
    ahead = sorted(g for g in restored_groups if (index := group_index(g)) is not None and index >= position)
    if ahead:
        found.dataloader.append(f"{what} brought back {', '.join(ahead[:5])} at or past its dataloader index "
                                f"{position}: those indices would be handed out again")
    return highest_admitted


TAIL_S = 2.0
"""A restore that keeps the journal after its cut keeps every row and group the incarnation's log shows more
than this long before its last event: the journal's fsync batch and the audit log's flush each trail by well
under a second, so only the last moments before a kill may be in one and not the other."""


def _went_on_from(restored: Restored, cut: CutTaken, at_cut: dict, kept: dict,
                  found: _Findings) -> tuple[int, int, _Live] | None:
    """(incarnation, index, state) the restore went on from: the cut's own incarnation at the cut, or an earlier
    incarnation that restored the same cut (kept past it) and died before it saved anything newer."""
    journal = restored.kept_after_cut.journal
    inc = int(journal.rsplit("-", 1)[1]) if journal else cut.inc
    if inc == cut.inc:
        return (cut.inc, *at_cut[cut.cut_unix_s])
    if (inc, cut.cut_unix_s) in kept:
        return (inc, *kept[(inc, cut.cut_unix_s)])
    found.groups.append(f"restore of incarnation {restored.inc} went on from the journal of incarnation {inc}, "
                        f"which never restored its cut at {cut.cut_unix_s}")
    return None


def _restore_past_cut(restored: Restored, cut: CutTaken, start: tuple[int, int, _Live] | None, events: list,
                      found: _Findings) -> None:
    """A restore that read the journal on past its cut must bring back what its starting point held (the cut, or
    an earlier restore of it that went on) and what that incarnation went on to seal and admit, less what it
    discarded or threw away; the groups of its train steps after that point are open again (those steps were
    lost with the trainer). Rows the log never saw sealed are only counted: the kill may have taken their audit
    line."""
    found.restores_checked += 1
    if start is None:
        return
    dead, cut_index, held = start
    what = f"restore of incarnation {restored.inc} at step {restored.step} (journal kept past its cut)"
    last = max(e.t for e in events if e.inc == dead)
    rows = {row_key(g, s) for g, siblings in held.rows.items() for s in siblings}
    groups, maybe_rows = set(held.groups), set(rows)
    for event in events[cut_index + 1:]:
        if event.inc != dead:
            continue
        settled = event.t <= last - TAIL_S
        if isinstance(event, SiblingSealed):
            maybe_rows.add(row_key(event.group_id, event.sibling))
            if settled:
                rows.add(row_key(event.group_id, event.sibling))
        elif isinstance(event, GroupAdmitted) and settled:
            groups.add(event.group_id)
        elif isinstance(event, GroupsDiscarded):
            groups -= set(event.group_ids)
            rows = {r for r in rows if r.rsplit(".", 1)[0] not in event.group_ids}
        elif isinstance(event, (GroupRerun, GroupDropped)):
            rows = {r for r in rows if r.rsplit(".", 1)[0] != event.group_id}
        elif isinstance(event, StepTrained) and event.step <= restored.step:
            _trained_and_gone(rows, groups, event.group_ids)  # a step the restore keeps with a surviving trainer
    for kept in restored.kept_after_cut.kept_steps if restored.kept_after_cut else []:
        _trained_and_gone(rows, groups, kept.group_ids)  # its `step_trained` line may have died with the controller
    kept_rows = {row_key(r.group_id, r.sibling) for r in restored.rows}
    kept_groups = set(restored.unfinished_groups)
    if lost := sorted(rows - kept_rows):
        found.rows.append(f"{what} lost {len(lost)} rows sealed before its incarnation's last {TAIL_S:.0f}s and "
                          f"never discarded: {', '.join(lost[:5])}")
    if lost := sorted(groups - kept_groups):
        found.groups.append(f"{what} lost {len(lost)} open groups (admitted, restored or undone by the crash): "
                            f"{', '.join(lost[:5])}")
    found.unseen_rows += len(kept_rows - maybe_rows)
    if restored.next_group_index < cut.next_group_index:
        found.dataloader.append(f"{what} put the dataloader at index {restored.next_group_index}, behind its cut's "
                                f"{cut.next_group_index}: {_moved(restored.next_group_index, cut.next_group_index)}")


def _trained_and_gone(rows: set[str], groups: set[str], group_ids: list[str]) -> None:
    """A trained group's rows and the group itself leave the state."""
    groups -= set(group_ids)
    rows -= {r for r in rows if r.rsplit(".", 1)[0] in group_ids}


def _run_ended(event: RunEnded, live: _Live, found: _Findings) -> None:
    """The groups the events leave open are exactly the ones the run says it leaves outstanding."""
    outstanding = set(event.outstanding_groups)
    found.ends_compared += len(live.groups | outstanding)
    for group in sorted(live.groups - outstanding):
        found.groups.append(f"group {group} was never trained, discarded or left outstanding: incarnation "
                            f"{event.inc} ended without it")
    for group in sorted(outstanding - live.groups):
        found.groups.append(f"group {group} left outstanding by incarnation {event.inc}, but it was never admitted "
                            "or restored, or it had ended already")
