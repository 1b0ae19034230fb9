"""The slowest in-flight turn per attempt, from audit events alone."""

from __future__ import annotations

from turnkeep.bench.turn_bound import turn_bounds
from turnkeep.schemas.audit import HoldChanged, SiblingSealed, SiblingStarted, TurnCommitted


def started(t, rid):
    gid, sib, att = rid.rsplit(".", 2)
    return SiblingStarted(t=t, inc=1, rollout_id=rid, group_id=gid, sibling=int(sib), attempt=int(att))


def committed(t, rid, turn):
    gid, sib, att = rid.rsplit(".", 2)
    return TurnCommitted(t=t, inc=1, rollout_id=rid, group_id=gid, sibling=int(sib), attempt=int(att), turn=turn,
                         policy_version=1, tokens=4)


def sealed(t, rid):
    gid, sib, att = rid.rsplit(".", 2)
    return SiblingSealed(t=t, inc=1, rollout_id=rid, group_id=gid, sibling=int(sib), attempt=int(att), num_turns=1,
                         generated_tokens=4, policy_versions=[1])


def hold(t, change, attempt):
    return HoldChanged(t=t, inc=1, change=change, holder=f"snapshot:{attempt}", holds=["admission", "deadlines"])


def test_the_bound_is_the_last_running_agents_next_boundary_after_admission_closed():
    events = [
        started(1.0, "g1.0.0"), started(1.0, "g1.1.0"), started(1.0, "g2.0.0"),
        sealed(2.0, "g2.0.0"),  # finished before the attempt: not in flight
        hold(10.0, "taken", "r.snapshot.3.1"),
        started(10.1, "g3.0.0"),  # admitted after the close (it was already on its way): not counted
        committed(10.2, "g1.0.0", 2), committed(10.5, "g3.0.0", 1), committed(10.7, "g1.1.0", 1),
        committed(10.9, "g1.0.0", 3),  # its second boundary after the close: the first one counts
        hold(11.0, "released", "r.snapshot.3.1"),
        committed(12.0, "g2.0.0", 9),
        hold(20.0, "taken", "r.snapshot.3.2"),  # nothing commits while it holds
        hold(20.4, "released", "r.snapshot.3.2"),
        committed(21.0, "g1.1.0", 2),
    ]
    bounds = turn_bounds(list(reversed(events)))  # read in time order whatever the file order
    first, second = bounds["r.snapshot.3.1"], bounds["r.snapshot.3.2"]
    assert (first.slowest_turn_s, first.agents) == (0.7, 2)
    assert (second.slowest_turn_s, second.agents) == (0.0, 3)
