"""Invariant 5 against wall time: between its start and its expiry a rollout that timed out had at
least its budget outside the stretches the deadline clocks were held (parked), whatever its own
clock read."""

from tests.chaos.invariants.history import (
    broken,
    healthy,
    hold,
    insert_before,
    is_event,
    r,
    replace,
    sibling,
    without_new_events,
)
from turnkeep.chaos.verdict import check_invariants
from turnkeep.schemas.audit import DeadlineExpired, RunEnded

NAME = "no deadline ran while parked"


def test_a_healthy_log_with_a_parked_rollout_that_timed_out_passes():
    result = check_invariants(healthy()).result(5, NAME)
    assert result.ok and result.checked == 1 and result.note == ""


def test_a_deadline_that_ran_while_parked_is_broken_even_when_its_clock_says_otherwise():
    # g2.1.0 started at 1008 and was parked from 1010 to 1017.5; expiring at 1023 it ran only 7.5 s of its
    # 15 s budget, though its own clock (which kept running while parked) read the whole budget.
    history = replace(healthy(), is_event(DeadlineExpired),
                      DeadlineExpired(t=1023, inc=1, rollout_id=r(2, 1, 0), budget_s=15.0, running_s=15.0))
    assert broken(check_invariants(history), 5, NAME) == [
        "g0000002.1.0 timed out 15.00s of wall time after it started, 7.50s of them parked: its deadline ran while "
        "parked (7.50s of its 15.00s budget; incarnation 1)"
    ]


def test_a_deadline_that_fired_early_without_parking_is_broken():
    history = insert_before(healthy(), is_event(RunEnded, inc=3), sibling(1203.5, 3, r(5, 0, 0)),
                            DeadlineExpired(t=1206, inc=3, rollout_id=r(5, 0, 0), budget_s=5.0, running_s=5.0))
    assert broken(check_invariants(history), 5, NAME) == [
        "g0000005.0.0 timed out 2.50s of wall time after it started, none of them parked: its deadline fired early "
        "(2.50s of its 5.00s budget; incarnation 3)"
    ]


def test_parked_time_ends_where_the_lease_ran_out():
    # A snapshot hold never released: the hold set dropped it when its 2 s lease ran out, so the
    # clock ran again from 1205.5 and 4 s of running time by 1209.5 is the whole budget.
    history = insert_before(healthy(), is_event(RunEnded, inc=3), sibling(1203.5, 3, r(5, 0, 0)),
                            hold(1203.5, 3, "taken", "snapshot:r.snapshot.4.1", ["deadlines"], lease_s=2.0),
                            DeadlineExpired(t=1209.5, inc=3, rollout_id=r(5, 0, 0), budget_s=4.0, running_s=4.0))
    assert check_invariants(history).result(5, NAME).ok


def test_a_rollout_without_its_start_in_the_log_is_measured_from_its_incarnation_start():
    history = insert_before(healthy(), is_event(RunEnded, inc=3),
                            DeadlineExpired(t=1209, inc=3, rollout_id=r(5, 0, 0), budget_s=60.0, running_s=60.0))
    result = check_invariants(history).result(5, NAME)
    assert not result.ok and "9.00s of wall time" in result.violations[0]
    assert result.note == "1 rollouts without sibling_started measured from their incarnation's start"


def test_a_log_without_hold_events_measures_wall_time_alone():
    result = check_invariants(without_new_events(healthy())).result(5, NAME)
    assert result.ok and not result.unchecked
    assert result.note == "parked time unknown (no hold_changed events in this log): measured against wall time alone"
