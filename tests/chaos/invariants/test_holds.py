"""Invariant 4's lease check from `hold_changed` events: while the run lives, every holder is released
or renewed within its lease (and one without a lease is released), not only at a clean exit."""

from tests.chaos.invariants.history import (
    SNAPSHOT_1,
    broken,
    healthy,
    hold,
    incarnation_1,
    incarnation_2,
    incarnation_3,
    insert_before,
    is_event,
    replace,
    without_new_events,
)
from turnkeep.chaos.invariants.holds import hold_spans, parked_intervals
from turnkeep.chaos.verdict import check_invariants
from turnkeep.schemas.audit import HoldChanged, RunEnded

NAME = "holds released or renewed within"


def _before_the_end(*new) -> list:
    return insert_before(healthy(), is_event(RunEnded, inc=3), *new)


def test_a_healthy_log_releases_every_hold_within_its_lease():
    result = check_invariants(healthy()).result(4, NAME)
    assert result.ok and not result.unchecked and result.checked == 6  # two attempts in two sets, two restores


def test_a_hold_never_released_while_the_killed_incarnation_lived_on_is_stuck():
    # Incarnation 2 takes a hold at 1103.5 with a 5 s lease and lives until 1119 without letting go;
    # it never ends cleanly, so the holders `run_ended` lists could not have shown it.
    history = insert_before(healthy(), is_event(HoldChanged, holder="recovery:2", change="released"),
                            hold(1103.5, 2, "taken", "snapshot:r.snapshot.1.2", lease_s=5.0))
    assert broken(check_invariants(history), 4, NAME) == [
        "snapshot:r.snapshot.1.2 (admission, deadlines) never released: its lease ran out 5.0s after it was taken "
        "(last renewed or taken) and the incarnation lived 10s longer (incarnation 2)"
    ]


def test_a_hold_taken_again_after_its_lease_dropped_it_is_a_note():
    # A prepare retried after an outage takes the hold again: its holder is alive, the lease did its job.
    history = _before_the_end(hold(1203.5, 3, "taken", "snapshot:r.snapshot.4.1", ["admission"], lease_s=1.0),
                              hold(1207, 3, "taken", "snapshot:r.snapshot.4.1", ["admission"], lease_s=1.0),
                              hold(1207.5, 3, "released", "snapshot:r.snapshot.4.1", ["admission"]))
    result = check_invariants(history).result(4, NAME)
    assert result.ok and result.checked == 8
    assert result.note == "1 holds released (or taken again) after their lease had dropped them (up to 2.5s late)"


def test_a_hold_released_after_its_lease_dropped_it_is_a_note():
    # The attempt stalled (a Temporal restart, say) and the lease let go first, as it is there to.
    history = _before_the_end(hold(1203.5, 3, "taken", "snapshot:r.snapshot.4.1", ["admission"], lease_s=2.0),
                              hold(1209, 3, "released", "snapshot:r.snapshot.4.1", ["admission"]))
    result = check_invariants(history).result(4, NAME)
    assert result.ok
    assert result.note == "1 holds released (or taken again) after their lease had dropped them (up to 3.5s late)"


def test_a_hold_renewed_in_time_may_outlast_its_first_lease():
    history = _before_the_end(hold(1203.5, 3, "taken", "snapshot:r.snapshot.4.1", ["admission"], lease_s=2.0),
                              hold(1205, 3, "renewed", "snapshot:r.snapshot.4.1", ["admission"], lease_s=2.0),
                              hold(1206.5, 3, "renewed", "snapshot:r.snapshot.4.1", ["admission"], lease_s=2.0),
                              hold(1208, 3, "released", "snapshot:r.snapshot.4.1", ["admission"]))
    assert check_invariants(history).result(4, NAME).ok


def test_a_hold_whose_incarnation_died_before_its_lease_ran_out_is_the_leases_job():
    inc1 = replace(incarnation_1(), is_event(HoldChanged, holder=SNAPSHOT_1, change="released"))
    result = check_invariants(inc1 + incarnation_2() + incarnation_3()).result(4, NAME)
    assert result.ok  # renewed at 1015 for 30 s; incarnation 1 was last heard of at 1031.5


def test_a_restore_pause_never_released_is_stuck_once_the_run_lives_on():
    inc2 = replace(incarnation_2(), is_event(HoldChanged, holder="recovery:2", change="released"))
    inc2.append(hold(1200, 2, "renewed", "unrelated", ["admission"], lease_s=1.0))  # still alive 99 s later
    violations = broken(check_invariants(incarnation_1() + inc2), 4, NAME)
    assert violations == ["recovery:2 (admission) held without a lease for 99s while the incarnation lived, never "
                          "released (incarnation 2)"]


def test_a_hold_still_held_at_a_clean_end_is_broken_from_the_events_alone():
    # run_ended reports no holder (the product's own account); the events say otherwise.
    history = replace(healthy(), is_event(HoldChanged, holder="recovery:3", change="released"))
    assert broken(check_invariants(history), 4, NAME) == [
        "recovery:3 (admission) still held when the incarnation ended, 9.0s after it was taken (incarnation 3)"
    ]


def test_a_log_without_hold_events_is_not_checked():
    result = check_invariants(without_new_events(healthy())).result(4, NAME)
    assert result.ok and result.unchecked and result.note == "not checked: no hold_changed events in this log"


def test_hold_spans_end_at_the_release_or_where_the_lease_ran_out():
    events = [
        hold(10, 1, "taken", "a", ["deadlines"], lease_s=5),
        hold(12, 1, "renewed", "a", ["deadlines"], lease_s=5),
        hold(14, 1, "released", "a", ["deadlines"]),
        hold(20, 1, "taken", "b", ["deadlines"], lease_s=5),  # never released: dropped at 25
        hold(21, 1, "taken", "c", ["deadlines"], lease_s=2),  # overlaps b
        hold(40, 1, "renewed", "b", ["deadlines"], lease_s=5),  # too late: b is gone, nothing renewed
        hold(50, 1, "released", "z", ["deadlines"]),  # never taken
    ]
    spans = hold_spans(events)
    assert [(s.holder, s.start, s.end()) for s in spans] == [("a", 10, 14), ("b", 20, 25), ("c", 21, 23)]
    assert parked_intervals(spans, "deadlines", {1: 50}) == {1: [(10, 14), (20, 25)]}
