"""Invariant 2 from the killed incarnation's side: the agents it had running with a journaled turn of the restored
lineage are continued by the restore that keeps its journal (or named as started over by their level)."""

from __future__ import annotations

from tests.chaos.invariants.history import g, healthy_with_a_journal_restore, r
from turnkeep.chaos.invariants.results import AuditCounts
from turnkeep.chaos.invariants.running_agents import NAME, running_agents_continued
from turnkeep.chaos.verdict import check_invariants
from turnkeep.schemas.audit import KeptStep, Restored, RowRef, RunEnded, SiblingFailed, StepTrained, TurnCommitted

RUNNING = r(5, 0, 0)
"""Incarnation 3 started it at 1207.1 and committed its turn 1 at 1207.2; its last line is at 1210."""


def _kept_journal_of_incarnation_3(**changes) -> list:
    """`healthy_with_a_journal_restore` (its last restore keeps incarnation 3's journal past the cut), with `changes`
    to that restore."""
    return [e.model_copy(update=changes) if isinstance(e, Restored) and e.inc == 4 else e
            for e in healthy_with_a_journal_restore()]


def test_a_restore_that_continues_the_agent_its_killed_incarnation_ran_holds():
    counts = AuditCounts()
    result = running_agents_continued(_kept_journal_of_incarnation_3(), counts)
    assert result.ok and result.checked == 1 and result.note == "1 restores had running agents to continue"
    assert counts.restores_owing_agents == 1


def test_a_restore_that_drops_a_running_agent_is_broken_through_the_whole_checker():
    verdict = check_invariants(_kept_journal_of_incarnation_3(continuations=[]))
    result = verdict.result(2, NAME)
    assert not result.ok and result.violations == [
        f"{RUNNING} was running when incarnation 3 died, with turn 1 (policy 0) committed 2.80s before its last "
        "line, and incarnation 4's restore neither continued it nor named it as started over"
    ]


def test_a_turn_inside_the_journal_grace_is_not_owed():
    history = [e.model_copy(update={"t": 1209.7}) if isinstance(e, TurnCommitted) and e.rollout_id == RUNNING
               and e.inc == 3 else e for e in _kept_journal_of_incarnation_3(continuations=[])]
    result = running_agents_continued(history)
    assert result.ok and result.checked == 0


def test_an_agent_whose_row_the_restore_kept_or_whose_level_starts_over_is_not_owed():
    sealed_past_the_audit = [RowRef(group_id=g(5), sibling=0, rollout_id=RUNNING)]
    for changes in ({"rows": sealed_past_the_audit}, {"agents_not_continued": [RUNNING]}):
        result = running_agents_continued(_kept_journal_of_incarnation_3(continuations=[], **changes))
        assert result.ok and result.checked == 0, changes


def test_an_agent_whose_group_a_kept_trainer_step_trained_is_not_owed():
    """The controller died between its trainer's step and its audit flush: the step's seal lines are lost, the
    restore keeps the step (its groups trained whole), and its agents are nobody's to continue."""
    kept = next(e for e in healthy_with_a_journal_restore() if isinstance(e, Restored) and e.inc == 4).kept_after_cut
    trained = kept.model_copy(update={"kept_steps": [KeptStep(step=9, group_ids=[g(5)])]})
    result = running_agents_continued(_kept_journal_of_incarnation_3(continuations=[], kept_after_cut=trained))
    assert result.ok and result.checked == 0
    other = kept.model_copy(update={"kept_steps": [KeptStep(step=9, group_ids=[g(6)])]})
    assert not running_agents_continued(_kept_journal_of_incarnation_3(continuations=[], kept_after_cut=other)).ok


def test_a_turn_of_a_rolled_back_policy_is_owed_only_when_the_restore_kept_that_policy():
    def turn_of_policy_9(history: list) -> list:
        return [e.model_copy(update={"policy_version": 9}) if isinstance(e, TurnCommitted) and e.rollout_id == RUNNING
                and e.inc == 3 else e for e in history]

    rolled_back = turn_of_policy_9(_kept_journal_of_incarnation_3(continuations=[]))
    assert running_agents_continued(rolled_back).checked == 0
    # Incarnation 3 trained policy 9 after the cut: the kept journal holds its turns, the restore owes the agent.
    end_of_3 = next(i for i, e in enumerate(rolled_back) if isinstance(e, RunEnded) and e.inc == 3)
    kept = rolled_back[:end_of_3] + [StepTrained(t=1208, inc=3, step=9, policy_version=9, group_ids=[])] \
        + rolled_back[end_of_3:]
    result = running_agents_continued(kept)
    assert not result.ok and result.checked == 1


def test_a_restore_that_kept_no_journal_is_not_judged():
    result = running_agents_continued(_kept_journal_of_incarnation_3(kept_after_cut=None, continuations=[]))
    assert result.ok and result.checked == 0


def test_an_attempt_that_failed_before_the_kill_is_not_owed():
    """Its server went away under it after turn 1: the attempt ended (its sibling's next attempt runs), so the
    restore owes nothing for it (a chaos run with env kills flagged 231 such attempts)."""
    history = _kept_journal_of_incarnation_3(continuations=[])
    end_of_3 = next(i for i, e in enumerate(history) if isinstance(e, RunEnded) and e.inc == 3)
    failed = SiblingFailed(t=1207.4, inc=3, rollout_id=RUNNING, group_id=g(5), sibling=0, attempt=0,
                           reason="interrupted, its environment server is away: failed: ServerDisconnectedError",
                           will_retry=True)
    result = running_agents_continued(history[:end_of_3] + [failed] + history[end_of_3:])
    assert result.ok and result.checked == 0
