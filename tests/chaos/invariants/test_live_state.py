"""Invariant 7 from events: rows sealed before a cut are in it, every admitted group ends exactly
once, the dataloader skips no index; each broken on purpose, and a healthy log passes."""

from tests.chaos.invariants.history import (
    CUT_1,
    CUT_2,
    admitted,
    broken,
    cut,
    ended,
    g,
    healthy,
    insert_before,
    is_event,
    replace,
    restored,
    without_new_events,
)
from turnkeep.chaos.invariants.live_state import DATALOADER, GROUPS, ROWS
from turnkeep.chaos.verdict import check_invariants
from turnkeep.schemas.audit import CutTaken, GroupAdmitted, GroupsDiscarded, Restored, RunEnded, SiblingSealed


def test_a_healthy_log_passes_all_three_checks():
    verdict = check_invariants(healthy())
    for name in (ROWS, GROUPS, DATALOADER):
        result = verdict.result(7, name)
        assert result.ok and not result.unchecked and result.checked > 0, verdict.format()


def test_a_sealed_row_missing_from_a_cut_is_lost():
    # g1/0 was sealed at 1006; the trainer checkpoint's cut at step 1 does not hold it.
    history = replace(healthy(), is_event(CutTaken, cut_unix_s=1007.5),
                      cut(1007.5, 1, "trainer_checkpoint", 1, 1007.5, rows=[], groups=[1], next_index=2))
    assert broken(check_invariants(history), 7, ROWS) == [
        "trainer_checkpoint cut at step 1 (incarnation 1) holds 0 rows; 1 were sealed before it and not trained, "
        "discarded or rerun: 1 rows missing"
    ]


def test_a_cut_holding_another_row_than_the_sealed_one_is_broken():
    history = replace(healthy(), is_event(CutTaken, cut_unix_s=1007.5),
                      cut(1007.5, 1, "trainer_checkpoint", 1, 1007.5, rows=[(1, 1)], groups=[1], next_index=2))
    assert broken(check_invariants(history), 7, ROWS)[0].endswith("as many rows, but not the same ones")


def test_a_cut_holding_a_row_the_log_never_saw_sealed_is_broken():
    # Rows the cut holds must have been sealed (in the log) first: a row the log never saw is "too many".
    history = replace(healthy(), is_event(SiblingSealed, rollout_id=f"{g(1)}.0.0"))
    assert broken(check_invariants(history), 7, ROWS)[0].endswith("1 rows too many")


def test_a_restore_that_brings_back_fewer_rows_than_its_cut_held_is_broken():
    history = replace(healthy(), is_event(Restored, inc=2),
                      restored(1102, 2, 1, CUT_1, rows=[], unfinished=[1, 2], next_index=3))
    violations = broken(check_invariants(history), 7, ROWS)
    assert violations == ["restore of incarnation 2 at step 1 brought back 0 rows; its snapshot cut at step 1 held 1: "
                          "1 rows missing"]


def test_an_admitted_group_that_never_ends_is_lost_at_the_end_of_the_run():
    history = replace(healthy(), is_event(RunEnded, inc=3), ended(1210, 3, 4, outstanding=[]))
    violations = broken(check_invariants(history), 7, GROUPS)
    assert violations == ["group g0000005 was never trained, discarded or left outstanding: incarnation 3 ended "
                          "without it"]


def test_an_admitted_group_missing_from_a_cut_is_lost():
    # g3 is never discarded: the snapshot at step 3 should still hold it, but holds only g4.
    history = replace(healthy(), is_event(GroupsDiscarded, group_ids=[g(3)]))
    violations = broken(check_invariants(history), 7, GROUPS)
    assert violations == ["snapshot cut at step 3 (incarnation 2) holds 1 unfinished groups; 2 were admitted or "
                          "restored and not trained or discarded: 1 groups missing"]


def test_a_restore_that_drops_an_unfinished_group_of_its_cut_is_broken():
    history = replace(healthy(), is_event(Restored, inc=2),
                      restored(1102, 2, 1, CUT_1, rows=[(1, 0)], unfinished=[1], next_index=3))
    violations = broken(check_invariants(history), 7, GROUPS)
    assert "restore of incarnation 2 at step 1 brought back 1 unfinished groups; its snapshot cut at step 1 held 2: " \
           "1 groups missing" in violations


def test_a_group_discarded_after_it_was_trained_ends_twice():
    history = insert_before(healthy(), is_event(RunEnded, inc=3),
                            GroupsDiscarded(t=1208, inc=3, group_ids=[g(4)], reason="stale"))
    assert broken(check_invariants(history), 7, GROUPS) == [
        "group g0000004 discarded (stale) by incarnation 3, but it was not open (never admitted or restored, "
        "or it had ended already)"
    ]


def test_a_group_that_never_ends_is_caught_in_a_log_without_cuts_too():
    history = replace(without_new_events(healthy()), is_event(RunEnded, inc=3), ended(1210, 3, 4, outstanding=[]))
    verdict = check_invariants(history)
    assert broken(verdict, 7, GROUPS) == ["group g0000005 was never trained, discarded or left outstanding: "
                                          "incarnation 3 ended without it"]
    assert verdict.result(7, ROWS).unchecked


def test_a_skipped_dataloader_index_is_broken():
    # Incarnation 3 hands out g6 where g5 was due (the dataloader moved twice); its cut agrees with itself.
    history = replace(healthy(), is_event(GroupAdmitted, group_id=g(5)), admitted(1207, 3, 6))
    history = replace(history, is_event(CutTaken, cut_unix_s=1207.5),
                      cut(1207.5, 3, "trainer_checkpoint", 4, 1207.5, rows=[], groups=[6], next_index=7))
    history = replace(history, is_event(RunEnded, inc=3), ended(1210, 3, 4, outstanding=[6]))
    assert broken(check_invariants(history), 7, DATALOADER) == [
        "incarnation 3 admitted g0000006 when the dataloader was at index 5: index 5 skipped"
    ]


def test_a_restore_that_moves_the_dataloader_past_its_cut_is_broken():
    history = replace(healthy(), is_event(Restored, inc=3),
                      restored(1202, 3, 3, CUT_2, rows=[], unfinished=[4], next_index=6))
    history = replace(history, is_event(GroupAdmitted, group_id=g(5)), admitted(1207, 3, 6))
    history = replace(history, is_event(CutTaken, cut_unix_s=1207.5),
                      cut(1207.5, 3, "trainer_checkpoint", 4, 1207.5, rows=[], groups=[6], next_index=7))
    history = replace(history, is_event(RunEnded, inc=3), ended(1210, 3, 4, outstanding=[6]))
    violations = broken(check_invariants(history), 7, DATALOADER)
    assert violations == [
        "restore of incarnation 3 at step 3 put the dataloader at index 6; its snapshot cut at step 3 held 5: "
        "1 indices would be skipped",
        "restore of incarnation 3 at step 3 put the dataloader at index 6, but no group past index 4 was ever "
        "admitted: 1 skipped",
    ]


def test_a_cut_that_saves_the_dataloader_behind_its_groups_is_broken():
    history = replace(healthy(), is_event(CutTaken, cut_unix_s=CUT_2),
                      cut(1117, 2, "snapshot", 3, CUT_2, rows=[], groups=[4], next_index=4,
                          continuations=[f"{g(4)}.0.0", f"{g(4)}.1.0"]))
    assert "snapshot cut at step 3 (incarnation 2) saved dataloader index 4, but the groups admitted before it " \
           "reach index 4: 1 indices would be handed out again" in broken(check_invariants(history), 7, DATALOADER)


def test_a_skipped_index_is_caught_in_a_log_without_cuts_too():
    history = replace(without_new_events(healthy()), is_event(GroupAdmitted, group_id=g(3)), admitted(1108, 2, 7))
    violations = broken(check_invariants(history), 7, DATALOADER)
    assert violations[0] == "incarnation 2 admitted g0000007 when the dataloader was at index 3: indices 3 to 6 skipped"


def test_a_log_without_cuts_says_the_cut_checks_were_not_made():
    verdict = check_invariants(without_new_events(healthy()))
    assert verdict.ok, verdict.format()
    rows = verdict.result(7, ROWS)
    assert rows.unchecked and rows.note == "not checked: no cut_taken events in this log"
    assert "not checked" in verdict.format()
    assert verdict.result(7, GROUPS).note == "cuts not checked: no cut_taken events in this log"
