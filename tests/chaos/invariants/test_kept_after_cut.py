"""A restore that keeps the journal past its cut, checked from the audit log: what the cut's incarnation sealed,
admitted and trained after the cut must come back, the steps after the cut are undone, and agents continue
turns of the kept lineage only. Each check is broken on purpose once."""

from __future__ import annotations

from tests.chaos.invariants.history import (
    admitted,
    broken,
    continuation,
    ended,
    g,
    incarnation_1,
    incarnation_2,
    incarnation_3,
    r,
    replace,
    restored,
    sealed,
    sibling,
    trained,
    turn,
)
from turnkeep.chaos.verdict import check_invariants
from turnkeep.schemas.audit import KeptAfterCut, Restored, RowRef, TurnCommitted
from turnkeep.schemas.choices import AgentsFrom
from turnkeep.schemas.recovery import SourceKind

CUT_3 = 1207.5  # incarnation 3's trainer checkpoint at step 4: g5 open, dataloader at 6


def incarnation_3_killed_after_its_cut() -> list:
    """Incarnation 3 goes on past its checkpoint: seals g5's sibling 1 and all of g6, trains g6 as step 5 (policy
    5), admits g7, commits a second turn of g5.0.0 with policy 5, and is killed (no `run_ended`)."""
    events = [e for e in incarnation_3(journal_agent=True) if e.event != "run_ended"]
    return events + [
        sibling(1208, 3, r(5, 1, 0)), sealed(1209, 3, r(5, 1, 0)),
        admitted(1209.2, 3, 6), sibling(1209.3, 3, r(6, 0, 0)), sibling(1209.3, 3, r(6, 1, 0)),
        sealed(1210, 3, r(6, 0, 0)), sealed(1210.5, 3, r(6, 1, 0)),
        trained(1211, 3, 5, 6),
        admitted(1212, 3, 7),
        turn(1213, 3, r(5, 0, 0), 2).model_copy(update={"policy_version": 5}),
        sealed(1219.5, 3, r(7, 0, 0)),  # within the kill's tail: the journal may or may not have it
        turn(1220, 3, r(5, 0, 0), 3).model_copy(update={"policy_version": 5}),
    ]


def kept_restore(**changes) -> Restored:
    restore = restored(1302, 4, 4, CUT_3, rows=[(5, 1), (6, 0), (6, 1)], unfinished=[5, 6, 7], next_index=8,
                       continuations=[continuation(r(5, 0, 0), "b52", turn_index=2)])
    restore = restore.model_copy(update={
        "source": SourceKind.TRAINER_CHECKPOINT, "snapshot_dir": None, "agents_from": AgentsFrom.JOURNAL,
        "reason": "no published snapshot under checkpoints/step_4",
        "kept_after_cut": KeptAfterCut(records=40, undone_steps=[5], newest_policy_version=5)})
    return restore.model_copy(update=changes)


def incarnation_4_after_a_kept_restore(restore: Restored) -> list:
    return [
        restore,
        sibling(1303, 4, r(5, 0, 1), resumed_from=r(5, 0, 0), resumed_turn=2),
        sealed(1304, 4, r(5, 0, 1), resumed_turn=2, prefix_sha="b52"),
        trained(1305, 4, 5, 6),  # the undone step, trained again first
        sibling(1305.5, 4, r(7, 0, 0)), sibling(1305.5, 4, r(7, 1, 0)),
        sealed(1306, 4, r(7, 0, 0)), sealed(1306.5, 4, r(7, 1, 0)),
        trained(1307, 4, 6, 5, 7),
        ended(1310, 4, 6),
    ]


def history(restore: Restored | None = None) -> list:
    from tests.chaos.invariants.history import started

    return (incarnation_1() + incarnation_2() + incarnation_3_killed_after_its_cut() + [started(1300, 4, True)]
            + incarnation_4_after_a_kept_restore(restore or kept_restore()))


def test_a_restore_that_keeps_what_came_after_its_cut_passes():
    verdict = check_invariants(history())
    assert verdict.ok, verdict.format()
    assert verdict.result(7, "every sealed row").note == ""


def test_the_same_restore_judged_as_an_exact_one_breaks_its_cut():
    violations = broken(check_invariants(history(kept_restore(kept_after_cut=None))), 7, "every sealed row")
    assert any("brought back 3 rows" in v for v in violations)


def test_a_row_sealed_after_the_cut_that_the_restore_dropped_is_lost():
    restore = kept_restore(rows=[row for row in kept_restore().rows if row.group_id != "g0000006"])
    violations = broken(check_invariants(history(restore)), 7, "every sealed row")
    assert "lost 2 rows" in violations[0] and "g0000006.0" in violations[0]


def test_the_groups_of_an_undone_step_must_come_back_open():
    restore = kept_restore(unfinished_groups=["g0000005", "g0000007"])
    violations = broken(check_invariants(history(restore)), 7, "every admitted group")
    assert any("lost 1 open groups" in v and "g0000006" in v for v in violations)


def test_a_row_sealed_in_the_last_moments_before_the_kill_may_be_missing_or_kept():
    """g7.0.0 was sealed 0.5 s before the kill: the journal may hold it; either way is fine."""
    with_row = kept_restore(rows=[*kept_restore().rows, kept_restore().rows[0].model_copy(
        update={"group_id": "g0000007", "sibling": 0, "rollout_id": "g0000007.0.0"})])
    events = history(with_row)
    events = replace(events, lambda e: e.event == "sibling_sealed" and e.inc == 4 and e.rollout_id == "g0000007.0.0")
    assert check_invariants(events).ok


def test_a_continued_turn_of_a_policy_the_incarnation_never_trained_is_caught():
    events = history()
    events = replace(events, lambda e: isinstance(e, TurnCommitted) and e.rollout_id == r(5, 0, 0) and e.turn == 2,
                     turn(1213, 3, r(5, 0, 0), 2).model_copy(update={"policy_version": 6}))
    violations = broken(check_invariants(events), 2, "journaled agents")
    assert "policy versions [6], newer than the restored lineage's 5" in violations[0]


def test_a_restore_that_claims_a_policy_version_its_cut_never_reached_is_caught():
    restore = kept_restore(kept_after_cut=KeptAfterCut(records=40, undone_steps=[5, 6], newest_policy_version=6))
    violations = broken(check_invariants(history(restore)), 2, "journaled agents")
    assert "says it kept policy version 6, but its cut's incarnation trained up to 5" in violations[0]


def chained_history(restore: Restored | None = None) -> list:
    """Incarnation 4 restores the cut, goes on (seals g5.0.1, trains g6 again as step 5, seals g7, trains step 6)
    and is killed before it saves anything; incarnation 5 restores the same cut from incarnation 4's journal."""
    from tests.chaos.invariants.history import started

    inc4 = [e for e in incarnation_4_after_a_kept_restore(kept_restore()) if e.event != "run_ended"]
    second = restore or kept_restore(
        t=1402, inc=5, rows=[RowRef(group_id=g, sibling=s, rollout_id=f"{g}.{s}.0")
                             for g, s in (("g0000005", 0), ("g0000005", 1), ("g0000006", 0), ("g0000006", 1))],
        continuations=[],
        kept_after_cut=KeptAfterCut(records=20, undone_steps=[5, 6], newest_policy_version=6,
                                    journal="journal/inc-000004"))
    inc5 = [second, sibling(1403, 5, r(7, 0, 1)), sibling(1403, 5, r(7, 1, 1)),
            sealed(1404, 5, r(7, 0, 1)), sealed(1404, 5, r(7, 1, 1)),
            trained(1405, 5, 5, 6), trained(1406, 5, 6, 5, 7), ended(1410, 5, 6)]
    return (incarnation_1() + incarnation_2() + incarnation_3_killed_after_its_cut() + [started(1300, 4, True)]
            + inc4 + [started(1400, 5, True)] + inc5)


def test_a_second_restore_of_the_cut_is_held_to_what_the_first_one_went_on_to_do():
    verdict = check_invariants(chained_history())
    assert verdict.ok, verdict.format()


def test_a_second_restore_that_dropped_a_row_the_first_one_sealed_is_caught():
    base = chained_history()[-8]
    assert base.event == "restored" and base.inc == 5
    restore = base.model_copy(update={"rows": [row for row in base.rows if row.group_id != "g0000005" or row.sibling]})
    violations = broken(check_invariants(chained_history(restore)), 7, "every sealed row")
    assert "lost 1 rows" in violations[0] and "g0000005.0" in violations[0]


def test_a_restore_claiming_the_journal_of_an_incarnation_that_never_restored_its_cut_is_caught():
    base = chained_history()[-8]
    restore = base.model_copy(update={"kept_after_cut": base.kept_after_cut.model_copy(
        update={"journal": "journal/inc-000002"})})
    violations = broken(check_invariants(chained_history(restore)), 7, "every admitted group")
    assert any("journal of incarnation 2, which never restored its cut" in v for v in violations)


def test_a_second_restore_must_reopen_the_groups_the_first_one_trained_after_it():
    base = chained_history()[-8]
    restore = base.model_copy(update={"unfinished_groups": ["g0000005", "g0000007"],
                                      "rows": [row for row in base.rows if row.group_id != "g0000006"]})
    violations = broken(check_invariants(chained_history(restore)), 7, "every admitted group")
    assert any("lost 1 open groups" in v and "g0000006" in v for v in violations)


def fresh_kept_history(restore: Restored | None = None) -> list:
    """Incarnation 1 admits g0 and g1, trains g0 (step 1, policy 1), commits a turn of g1.0.0 with policy 1 and is
    killed before any checkpoint; incarnation 2 starts fresh, keeps its journal and trains step 1 again on g0."""
    from tests.chaos.invariants.history import started

    inc1 = [started(1000, 1, False), admitted(1001, 1, 0), admitted(1001, 1, 1),
            *[sibling(1001.5, 1, r(i, s, 0)) for i in (0, 1) for s in (0, 1)],
            sealed(1003, 1, r(0, 0, 0)), sealed(1003, 1, r(0, 1, 0)), sealed(1004, 1, r(1, 1, 0)),
            trained(1005, 1, 1, 0),
            turn(1006, 1, r(1, 0, 0), 1).model_copy(update={"policy_version": 1}),
            turn(1009, 1, r(1, 0, 0), 2).model_copy(update={"policy_version": 1})]
    keep = restore or restored(1102, 2, 0, None, rows=[(0, 0), (0, 1), (1, 1)], unfinished=[0, 1], next_index=2,
                               continuations=[continuation(r(1, 0, 0), "b10", turn_index=2)]).model_copy(update={
        "source": SourceKind.FRESH, "snapshot_dir": None, "checkpoint_dir": None, "policy_version": 0,
        "agents_from": AgentsFrom.JOURNAL,
        "kept_after_cut": KeptAfterCut(records=12, undone_steps=[1], newest_policy_version=1,
                                       journal="journal/inc-000001")})
    inc2 = [started(1100, 2, True), keep,
            sibling(1103, 2, r(1, 0, 1), resumed_from=r(1, 0, 0), resumed_turn=2),
            sealed(1104, 2, r(1, 0, 1), resumed_turn=2, prefix_sha="b10"),
            trained(1105, 2, 1, 0), trained(1106, 2, 2, 1), ended(1110, 2, 2)]
    return inc1 + inc2


def test_a_fresh_restart_that_keeps_the_first_journal_passes():
    verdict = check_invariants(fresh_kept_history())
    assert verdict.ok, verdict.format()


def test_a_fresh_restart_that_keeps_the_journal_must_reopen_the_undone_steps_groups():
    base = fresh_kept_history()[-6]
    assert base.event == "restored"
    restore = base.model_copy(update={"unfinished_groups": ["g0000001"],
                                      "rows": [row for row in base.rows if row.group_id != "g0000000"]})
    violations = broken(check_invariants(fresh_kept_history(restore)), 7, "every admitted group")
    assert any("lost 1 open groups" in v and "g0000000" in v for v in violations)


def without_admission_of(group_id: str, events: list) -> list:
    """The log as a kill inside the audit log's flush leaves it: the journal admitted the group, the log never
    said so."""
    return [e for e in events if not (e.event == "group_admitted" and e.group_id == group_id)]


def test_a_group_kept_open_whose_admission_the_kill_took_from_the_log_is_noted_not_skipped():
    verdict = check_invariants(without_admission_of("g0000007", history()))
    assert verdict.ok, verdict.format()
    assert verdict.result(7, "the dataloader").note == \
        "1 groups kept open past a cut whose admission the audit log lacks"


def test_a_kept_restore_that_passes_an_index_it_does_not_hold_open_skips_it():
    restore = kept_restore(unfinished_groups=["g0000005", "g0000006"])
    violations = broken(check_invariants(without_admission_of("g0000007", history(restore))), 7, "the dataloader")
    assert any("no group past index 6 was ever admitted and 1 of the indices between are not open in it" in v
               for v in violations), violations


def test_a_continuation_of_a_continuation_reaches_back_for_its_first_turns():
    """Incarnation 4's g5.0.1 continued g5.0.0 after turn 2 and committed only turn 3 before a kill; a restore
    continuing g5.0.1 after turn 3 judges turns 1 and 2 by g5.0.0's lines, which g5.0.1 never wrote."""
    from turnkeep.chaos.invariants.continuations import committed_turns

    # The builders' earlier lines leave `started_by` at 0; incarnation 4's own attempt says it started it.
    saved = continuation(r(5, 0, 1), "b53", turn_index=3).model_copy(update={"started_by": 4})
    restore_5 = kept_restore(inc=5, continuations=[saved])
    events = history() + [turn(1306, 4, r(5, 0, 1), 3).model_copy(update={"started_by": 4}), restore_5]
    assert committed_turns(events)[(r(5, 0, 1), 4)] == {1: 0, 2: 5, 3: 0}
    assert committed_turns(events)[(r(5, 0, 2), 5)] == {1: 0, 2: 5, 3: 0}
    # Without the restore that made g5.0.1 a continuation, g5.0.1 has only its own turn.
    no_link = [e for e in events if not (isinstance(e, Restored) and e.inc == 4)]
    assert committed_turns(no_link)[(r(5, 0, 1), 4)] == {3: 0}


def test_a_kept_restore_whose_cut_the_log_lost_may_pass_only_indices_it_holds_open():
    """The kill took the cut's `cut_taken` line: the restore is judged by the groups it holds, not waved through."""
    def dataloader(restore):
        return check_invariants(history(restore)).result(7, "the dataloader skips no index")

    holds_them = kept_restore(cut_unix_s=9999.0, next_group_index=10, unfinished_groups=[g(i) for i in range(5, 10)])
    assert dataloader(holds_them).ok
    skips_two = kept_restore(cut_unix_s=9999.0, next_group_index=10)
    assert any("2 of the indices between are not open in it: 2 skipped" in v
               for v in dataloader(skips_two).violations)
