"""Invariant 2's second check: every saved agent a restore brings back is continued (or rerun, as
its level says), and a restore brings back exactly the saved agents its cut checked."""

from tests.chaos.invariants.history import (
    CUT_1,
    broken,
    continuation,
    g,
    healthy,
    incarnation_1,
    incarnation_2,
    incarnation_3,
    insert_before,
    is_event,
    r,
    replace,
    restored,
    without_new_events,
)
from turnkeep.chaos.verdict import check_invariants
from turnkeep.schemas.audit import GroupRerun, Restored, RunEnded, SiblingStarted
from turnkeep.schemas.choices import AgentsFrom

NAME = "every saved agent continued"


def test_a_healthy_log_continues_every_saved_agent():
    result = check_invariants(healthy()).result(2, NAME)
    assert result.ok and result.checked == 7 and result.note == ""  # five saved agents, two restores matched


def test_a_saved_agent_never_continued_while_its_incarnation_ran_on_is_lost():
    history = replace(healthy(), is_event(SiblingStarted, rollout_id=r(1, 1, 1)))
    assert broken(check_invariants(history), 2, NAME) == [
        "saved agent g0000001.1.0 restored by incarnation 2 at step 1 was never continued: g0000001.1.1 never "
        "started, though the incarnation started others and lived 15s longer"
    ]


def test_a_saved_agent_never_continued_before_a_clean_end_is_lost():
    history = replace(healthy(), is_event(SiblingStarted, rollout_id=r(4, 1, 1)))
    violations = broken(check_invariants(history), 2, NAME)
    assert violations == ["saved agent g0000004.1.0 restored by incarnation 3 at step 3 was never continued: "
                          "g0000004.1.1 never started, though the incarnation started others and ended cleanly"]


def test_an_agent_its_level_reruns_must_be_rerun_too():
    history = replace(healthy(), is_event(SiblingStarted, rollout_id=r(2, 0, 1)))
    assert broken(check_invariants(history), 2, NAME)[0].startswith(
        "saved agent g0000002.0.0 restored by incarnation 2 at step 1 was never continued")


def test_a_saved_agent_of_a_group_rerun_whole_needs_no_continuation():
    history = replace(healthy(), is_event(SiblingStarted, rollout_id=r(1, 1, 1)))
    history = insert_before(history, is_event(SiblingStarted, rollout_id=r(2, 0, 1)),
                            GroupRerun(t=1104.1, inc=2, group_id=g(1), round=1, cause="prompt_group_restore",
                                       reason="restored at the prompt_group level", discarded_siblings=[0]))
    assert check_invariants(history).result(2, NAME).ok


def test_an_incarnation_killed_as_its_siblings_started_is_unverifiable_not_lost():
    inc2 = incarnation_2()
    inc2 = inc2[: next(i for i, e in enumerate(inc2) if isinstance(e, SiblingStarted)) + 1]  # killed right there
    history = incarnation_1() + inc2 + incarnation_3()
    result = check_invariants(history).result(2, NAME)
    assert result.ok and "2 saved agents unverifiable (killed before their siblings started)" in result.note


def test_a_saved_agent_lost_between_its_cut_and_the_restore_is_broken():
    # The cut checked three saved agents; the restore continues one and reruns one: the third vanished.
    history = replace(healthy(), is_event(Restored, inc=2),
                      restored(1102, 2, 1, CUT_1, rows=[(1, 0)], unfinished=[1, 2], next_index=3,
                               continuations=[continuation(r(1, 1, 0), "abc")], not_continued=[r(2, 0, 0)]))
    assert broken(check_invariants(history), 2, NAME) == [
        "restore of incarnation 2 brought back 2 saved agents (continued or rerun); its snapshot cut at step 1 "
        "checked 3: 1 saved agents lost between the cut and the restore"
    ]


def test_a_log_without_cuts_still_checks_that_restored_agents_continue():
    history = replace(without_new_events(healthy()), is_event(SiblingStarted, rollout_id=r(4, 1, 1)))
    verdict = check_invariants(history)
    assert len(broken(verdict, 2, NAME)) == 1
    assert verdict.result(2, NAME).note == "restores not compared with their cuts: no cut_taken events in this log"


def test_a_run_that_ends_before_any_restored_sibling_starts_is_unverifiable():
    inc3 = [e for e in incarnation_3() if not isinstance(e, SiblingStarted)]
    inc3 = [e for e in inc3 if e.event in ("run_started", "hold_changed", "restored")] + [
        RunEnded(t=1204, inc=3, step=3, reason="finished", outstanding_groups=[g(4)], admission_holders=[],
                 deadline_holders=[], trainer_holders=[])]
    result = check_invariants(incarnation_1() + incarnation_2() + inc3).result(2, NAME)
    assert result.ok and "2 saved agents unverifiable" in result.note


def _killed_right_after_its_restore_then_the_same_cut_again(drop: str | None) -> list:
    """Incarnation 2 restores CUT_1 from the turn journals and dies before it starts a sibling; incarnation 3
    restores the same cut (a chaos run's repeated kills), without `drop` when given."""
    def journal(event):
        return event.model_copy(update={"agents_from": AgentsFrom.JOURNAL}) if isinstance(event, Restored) else event

    inc2 = [journal(e) for e in incarnation_2()]
    killed = inc2[: next(i for i, e in enumerate(inc2) if isinstance(e, Restored)) + 1]
    again = [journal(e).model_copy(update={"inc": e.inc + 1, "t": e.t + 50}) for e in incarnation_2()]
    if drop is not None:
        again = [e.model_copy(update={"continuations": [c for c in e.continuations if c.rollout_id != drop]})
                 if isinstance(e, Restored) else e for e in again]
    return incarnation_1() + killed + again


def test_a_restore_of_the_same_cut_continues_the_agents_a_killed_incarnation_never_started():
    result = check_invariants(_killed_right_after_its_restore_then_the_same_cut_again(None)).result(2, NAME)
    assert result.ok and "3 saved agents unverifiable" in result.note, result


def test_a_restore_of_the_same_cut_that_forgets_an_agent_never_started_is_broken():
    """chaos40: the second restore read the agents its predecessor had reopened as pending, and reran them."""
    history = _killed_right_after_its_restore_then_the_same_cut_again(drop=r(1, 1, 0))
    assert broken(check_invariants(history), 2, NAME) == [
        "saved agent g0000001.1.0 restored by incarnation 2 was killed before it started, and incarnation 3 "
        "restored the same cut without it"
    ]
