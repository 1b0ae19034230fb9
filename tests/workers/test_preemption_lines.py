"""The last line of a preempted run names what its final snapshot kept of the running agents, in its mode's words."""

from __future__ import annotations

from schemas.choices import Outcome, Trigger
from schemas.snapshot import SnapshotAttemptResult
from workers.preemption import saved_agents


def _result(**counts) -> SnapshotAttemptResult:
    return SnapshotAttemptResult(checkpoint_id="r.snapshot.12.1", outcome=Outcome.PUBLISHED, reason="published",
                                 anchor_step=12, trigger=Trigger.PREEMPTION, **counts)


def test_a_journal_snapshot_names_the_agents_kept_in_the_journals_not_zero_parked() -> None:
    line = saved_agents(_result(journaled_agents=125))
    assert line == "step 12, 125 running agents kept in the turn journals" and "parked" not in line


def test_a_parked_snapshot_names_its_parked_agents_and_an_empty_one_says_so() -> None:
    assert saved_agents(_result(parked_agents=7)) == "step 12, 7 parked agents"
    assert saved_agents(_result()) == "step 12, no running agents to keep"
