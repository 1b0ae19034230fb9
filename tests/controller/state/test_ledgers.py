import dataclasses
import random

import pytest

from turnkeep.controller.state.claim_ledger import ClaimLedger
from turnkeep.controller.state.group_ledger import GroupLedger, SiblingEntry, SiblingState
from turnkeep.schemas.audit import ids_digest
from turnkeep.schemas.rollout import Problem

PROBLEM = Problem(question="Q 1+2+3", answer=6)


def test_claim_commit_and_release():
    claims = ClaimLedger()
    claims.claim(1, ["g1", "g2"])
    assert claims.claimed() == ["g1", "g2"]
    with pytest.raises(RuntimeError, match="already holds a claim"):
        claims.claim(1, ["g3"])
    assert claims.release(1) == ["g1", "g2"]
    claims.claim(1, ["g1"])
    assert claims.commit(1) == ["g1"]
    assert claims.claimed() == []


def test_claims_survive_a_state_dict_round_trip():
    claims = ClaimLedger()
    claims.claim(7, ["g1"])
    restored = ClaimLedger()
    restored.load_state_dict(claims.state_dict())
    assert restored.commit(7) == ["g1"]


def test_sibling_is_retried_up_to_max_attempts_then_dropped():
    ledger = GroupLedger()
    ledger.admit("g1", PROBLEM, group_size=2)
    assert ledger.start_attempt("g1", 0) == 0
    assert ledger.fail("g1", 0, "timed_out", max_attempts=2) is True
    assert ledger.start_attempt("g1", 0) == 1
    assert ledger.fail("g1", 0, "timed_out", max_attempts=2) is False
    state = ledger.state_dict()["groups"][0]["siblings"][0]
    assert state["state"] == SiblingState.DROPPED
    assert state["last_reason"] == "timed_out"


def test_group_settles_trainable_only_with_two_sealed_siblings():
    ledger = GroupLedger()
    ledger.admit("g1", PROBLEM, group_size=3)
    for sibling in range(3):
        ledger.start_attempt("g1", sibling)
    ledger.seal("g1", 0)
    assert ledger.settle("g1") is None
    ledger.seal("g1", 1)
    ledger.fail("g1", 2, "failed", max_attempts=1)
    assert ledger.settle("g1") is True
    assert ledger.complete_group_ids() == ["g1"]

    ledger.admit("g2", PROBLEM, group_size=2)
    ledger.start_attempt("g2", 0)
    ledger.start_attempt("g2", 1)
    ledger.seal("g2", 0)
    ledger.fail("g2", 1, "failed", max_attempts=1)
    assert ledger.settle("g2") is False


def test_group_ledger_round_trip_and_finish():
    ledger = GroupLedger()
    ledger.admit("g1", PROBLEM, group_size=2)
    ledger.start_attempt("g1", 1)
    restored = GroupLedger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.state_dict() == ledger.state_dict()
    assert restored.problem("g1") == PROBLEM
    restored.finish(["g1"])
    assert restored.inflight() == 0


def test_a_restore_reopens_running_siblings_without_spending_their_attempt_budget():
    ledger = GroupLedger()
    ledger.admit("g1", PROBLEM, 3)
    ledger.start_attempt("g1", 0)
    ledger.seal("g1", 0)
    assert ledger.start_attempt("g1", 1) == 0  # running when the snapshot was cut
    ledger.admit("g2", PROBLEM, 2)
    for sibling in (0, 1):
        ledger.start_attempt("g2", sibling)
        ledger.seal("g2", sibling)
    restored = GroupLedger()
    restored.load_state_dict(ledger.state_dict())

    to_run, settled = restored.reopen_after_restore()
    assert to_run == [("g1", 1), ("g1", 2)]
    assert settled == ["g2"]
    # Saved attempt 0 continues as attempt 1; the crash does not count against max_attempts=2.
    assert restored.start_attempt("g1", 1) == 1
    assert restored.fail("g1", 1, "boom", max_attempts=2) is True
    assert restored.start_attempt("g1", 1) == 2
    assert restored.fail("g1", 1, "boom", max_attempts=2) is False
    assert restored.sibling("g1", 1).state is SiblingState.DROPPED
    assert restored.group_ids() == ["g1", "g2"]


def test_an_attempt_cut_short_stays_continuable_until_an_incarnation_starts_it_again():
    """Chaos (chaos40): an incarnation restored a snapshot, reopened its running agents and died before it ran
    them; the next restore of the same snapshot read them as pending and reran 190 agents from scratch."""
    ledger = GroupLedger()
    ledger.incarnation = 3
    ledger.admit("g1", PROBLEM, 3)
    ledger.start_attempt("g1", 0)
    ledger.start_attempt("g1", 1)
    ledger.seal("g1", 1)
    assert ledger.continuable_attempts("g1") == {"g1.0.0": 3}

    # Incarnation 4 restores, reopens and dies before it starts anything: its journal holds the reopened ledger.
    fourth = GroupLedger()
    fourth.load_state_dict(ledger.state_dict())
    fourth.incarnation = 4
    assert fourth.reopen_after_restore()[0] == [("g1", 0), ("g1", 2)]
    fifth = GroupLedger()
    fifth.load_state_dict(fourth.state_dict())
    assert fifth.sibling("g1", 0).state is SiblingState.PENDING
    assert fifth.continuable_attempts("g1") == {"g1.0.0": 3}  # still the attempt incarnation 3 journaled

    fifth.incarnation = 5
    fifth.reopen_after_restore()
    assert fifth.start_attempt("g1", 0) == 1
    assert fifth.continuable_attempts("g1") == {"g1.0.1": 5}
    fifth.fail("g1", 0, "boom", max_attempts=3)
    assert fifth.continuable_attempts("g1") == {}  # a failed attempt is rerun, never continued


def test_a_whole_group_rerun_or_drop_continues_no_attempt_cut_short():
    ledger = GroupLedger()
    ledger.admit("g1", PROBLEM, 2)
    ledger.admit("g2", PROBLEM, 2)
    for gid in ("g1", "g2"):
        ledger.start_attempt(gid, 0)
    ledger.reopen_after_restore()
    ledger.restart_group("g1")
    ledger.drop_group("g2", "too many failures")
    assert ledger.continuable_attempts("g1") == ledger.continuable_attempts("g2") == {}


def test_groups_go_to_environments_by_weight_and_the_same_index_always_gets_the_same_one():
    from collections import Counter

    from turnkeep.controller.state.dataloader import PromptDataloader
    from turnkeep.envs.calc_task import CalcProblems
    from turnkeep.schemas.config import EnvironmentSpec, TaskConfig

    envs = {"calc": EnvironmentSpec(weight=3), "judge": EnvironmentSpec(kind="judge", weight=1)}
    first = PromptDataloader(CalcProblems(TaskConfig(), 5), seed=5, environments=envs)
    problems = [first.next_group()[1] for _ in range(400)]
    shares = Counter(p.env for p in problems)
    assert 240 < shares["calc"] < 360 and shares["calc"] + shares["judge"] == 400
    again = PromptDataloader(CalcProblems(TaskConfig(), 5), seed=5, environments=envs)
    again.load_state_dict({"seed": 5, "next_index": 123})
    assert again.next_group()[1] == problems[123]
    # One environment: the same problems as before environments existed.
    plain = PromptDataloader(CalcProblems(TaskConfig(), 5), seed=5)
    assert plain.next_group()[1].question == problems[0].question


def test_a_whole_group_rerun_abandons_running_attempts_and_a_cut_skips_their_saved_agents():
    from turnkeep.controller.state.continuations import check_continuations
    from turnkeep.controller.state.data_plane import DataPlane
    from turnkeep.schemas.participant import SavedAgent
    from turnkeep.schemas.rollout import Problem, RolloutRequest, TurnBoundary

    ledger, plane = GroupLedger(), DataPlane()
    problem = Problem(question="Q 1+2", answer=3)
    ledger.admit("g", problem, 3)
    for sibling in range(3):
        ledger.start_attempt("g", sibling)
    ledger.seal("g", 0)

    def saved(sibling: int) -> SavedAgent:
        request = RolloutRequest(rollout_id=f"g.{sibling}.0", group_id="g", sibling=sibling, attempt=0,
                                 problem=problem)
        return SavedAgent(request=request, boundary=TurnBoundary(rollout_id=request.rollout_id, turn_index=1,
                                                                 segments=[]), env_state=None)

    # Committed while the group ran: both running siblings were parked and saved.
    agents = [saved(1), saved(2)]
    assert [c["rollout_id"] for c in check_continuations(agents, ledger, plane)] == ["g.1.0", "g.2.0"]
    # Then sibling 2 failed in a group-scored environment, before the cut: the group reruns whole.
    assert ledger.restart_group("g") == [0]
    assert ledger.abandoned("g") == {"g.1.0", "g.2.0"} and ledger.round("g") == 1
    assert check_continuations(agents, ledger, plane) == []  # never continued, and no broken invariant
    restored = GroupLedger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.abandoned("g") == {"g.1.0", "g.2.0"} and restored.round("g") == 1


def _recounted(ledger: GroupLedger) -> tuple[str, list[tuple[str, int]]]:
    """The groups' digest and running siblings, computed from the full state the slow way."""
    groups = ledger.state_dict()["groups"]
    running = sorted((g["group_id"], i) for g in groups for i, s in enumerate(g["siblings"])
                     if s["state"] == SiblingState.RUNNING)
    return ids_digest(g["group_id"] for g in groups), running


def test_the_kept_digest_and_running_index_match_a_recount_after_any_changes():
    """What a cut reads without visiting every group equals what visiting every group gives."""
    rng = random.Random(7)
    ledger = GroupLedger()
    for step in range(2000):
        groups = ledger.group_ids()
        op = rng.random()
        if op < 0.15 or not groups:
            ledger.admit(f"g{rng.randrange(60)}", PROBLEM, group_size=3)  # now and then an id seen before
        else:
            gid, sibling = rng.choice(groups), rng.randrange(3)
            if op < 0.45:
                ledger.start_attempt(gid, sibling)
            elif op < 0.6:
                ledger.seal(gid, sibling)
            elif op < 0.7:
                ledger.fail(gid, sibling, "timed_out", max_attempts=2)
            elif op < 0.75:
                ledger.restart_group(gid)
            elif op < 0.8:
                ledger.drop_group(gid, "too many failures")
            elif op < 0.9:
                ledger.finish(rng.sample(groups, k=min(len(groups), 2)))
            elif op < 0.95:
                ledger.reopen_after_restore()
            else:
                restored = GroupLedger()
                restored.load_state_dict(ledger.state_dict())
                ledger = restored
        digest, running = _recounted(ledger)
        assert ledger.groups_digest() == digest, step
        assert sorted(ledger.running_siblings()) == running, step


def test_a_sibling_journals_every_field_it_has():
    """`as_dict` is written out by hand: a field added to SiblingEntry must be added there too."""
    entry = SiblingEntry(SiblingState.RUNNING, attempts=2, last_reason="timed_out", restarts=1, incarnation=3,
                         cut_short=True)
    assert entry.as_dict() == dataclasses.asdict(entry)
