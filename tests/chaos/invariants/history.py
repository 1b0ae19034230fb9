"""A healthy audit log with every event the checker reads, and builders for breaking it on purpose.

Three incarnations of a run with groups of two siblings and 30 s leases:

1. A new run. Trains g0 (step 1), takes a trainer checkpoint and a snapshot (step 1, three
   parked agents: g1.1.0 at the `turn` level, g2's two at the `sibling` level), during which
   g2.1.0 is parked for 7.5 s and later times out after its 15 s budget. Trains g1 after the
   snapshot (step 2, abandoned by the restore), then is killed.
2. Restores the snapshot: continues g1.1.0, reruns g2's agents; trains g1 and g2; g3 is rerun
   whole once and then dropped and discarded; g4 is admitted and a second snapshot (step 3)
   parks both its siblings; killed.
3. Restores the second snapshot, continues both of g4's agents, trains g4, admits g5 and ends
   cleanly with g5 outstanding.
"""

from __future__ import annotations

from turnkeep.schemas.audit import (
    ContinuationRef,
    CutTaken,
    DeadlineExpired,
    GroupAdmitted,
    GroupDropped,
    GroupRerun,
    GroupsDiscarded,
    HoldChanged,
    KeptAfterCut,
    Restored,
    RowRef,
    RunEnded,
    RunStarted,
    SiblingFailed,
    SiblingSealed,
    SiblingStarted,
    SnapshotPublished,
    StepTrained,
    TurnCommitted,
    TurnTokens,
    ids_digest,
    row_key,
)
from turnkeep.schemas.choices import AgentsFrom
from turnkeep.schemas.recovery import SourceKind

LEASE_S = 30.0
CUT_1 = 1016.0
CUT_2 = 1117.0
PARTIAL_TOKENS = 6
"""Tokens of g5.0.0's second turn that its turn journal made durable before incarnation 3 ended; incarnation 4
continues that turn from them."""


def g(index: int) -> str:
    return f"g{index:07d}"


def started(t, inc, resumed):
    return RunStarted(t=t, inc=inc, run_id="r", pid=1000 + inc, resumed=resumed)


def admitted(t, inc, index):
    return GroupAdmitted(t=t, inc=inc, group_id=g(index), size=2)


def sibling(t, inc, rollout_id, resumed_from=None, resumed_turn=0):
    group, sib, attempt = rollout_id.split(".")
    return SiblingStarted(t=t, inc=inc, rollout_id=rollout_id, group_id=group, sibling=int(sib), attempt=int(attempt),
                          resumed_from=resumed_from, resumed_turn=resumed_turn)


def turn(t, inc, rollout_id, turn_index):
    group, sib, attempt = rollout_id.split(".")
    return TurnCommitted(t=t, inc=inc, rollout_id=rollout_id, group_id=group, sibling=int(sib), attempt=int(attempt),
                         turn=turn_index, policy_version=0, tokens=10)


def sealed(t, inc, rollout_id, resumed_turn=0, prefix_sha=None):
    group, sib, attempt = rollout_id.split(".")
    return SiblingSealed(t=t, inc=inc, rollout_id=rollout_id, group_id=group, sibling=int(sib), attempt=int(attempt),
                         num_turns=2, generated_tokens=20, policy_versions=[0, 0], resumed_turn=resumed_turn,
                         prefix_sha=prefix_sha)


def trained(t, inc, step, *indices):
    return StepTrained(t=t, inc=inc, step=step, policy_version=step, group_ids=[g(i) for i in indices])


def cut(t, inc, kind, step, cut_unix_s, rows, groups, next_index, continuations=()):
    """`rows`: (group index, sibling) pairs; `groups`: group indices; `continuations`: rollout ids."""
    keys = [row_key(g(i), s) for i, s in rows]
    names = [g(i) for i in groups]
    return CutTaken(t=t, inc=inc, kind=kind, step=step, cut_unix_s=cut_unix_s, rows=len(keys),
                    rows_digest=ids_digest(keys), groups=len(names), groups_digest=ids_digest(names),
                    next_group_index=next_index, continuations=len(continuations),
                    continuations_digest=ids_digest(continuations))


def hold(t, inc, change, holder, holds=("admission", "deadlines"), lease_s=None):
    return HoldChanged(t=t, inc=inc, change=change, holder=holder, holds=list(holds), lease_s=lease_s)


def restored(t, inc, step, cut_unix_s, rows, unfinished, next_index, continuations=(), not_continued=()):
    return Restored(
        t=t, inc=inc, source=SourceKind.SNAPSHOT, step=step, policy_version=step,
        snapshot_dir=f"checkpoints/step_{step}/snapshots/1", checkpoint_dir=f"checkpoints/step_{step}",
        reason="newest published snapshot", skipped=[], cut_unix_s=cut_unix_s,
        rows=[RowRef(group_id=g(i), sibling=s, rollout_id=f"{g(i)}.{s}.0") for i, s in rows],
        continuations=list(continuations), unfinished_groups=[g(i) for i in unfinished], next_group_index=next_index,
        agents_not_continued=list(not_continued),
    )


def continuation(saved: str, boundary_sha: str, turn_index: int = 1) -> ContinuationRef:
    group, sib, attempt = saved.split(".")
    return ContinuationRef(rollout_id=saved, next_rollout_id=f"{group}.{sib}.{int(attempt) + 1}", group_id=group,
                           sibling=int(sib), turn_index=turn_index, boundary_sha=boundary_sha)


def ended(t, inc, step, outstanding=(), admission=(), deadlines=()):
    return RunEnded(t=t, inc=inc, step=step, reason="finished", outstanding_groups=[g(i) for i in outstanding],
                    admission_holders=list(admission), deadline_holders=list(deadlines), trainer_holders=[])


def r(index: int, sib: int, attempt: int) -> str:
    return f"{g(index)}.{sib}.{attempt}"


SNAPSHOT_1 = "snapshot:r.snapshot.1.1"
SNAPSHOT_2 = "snapshot:r.snapshot.3.1"


def incarnation_1() -> list:
    return [
        started(1000, 1, False),
        admitted(1001, 1, 0), admitted(1001, 1, 1),
        *[sibling(1001.5, 1, r(i, s, 0)) for i in (0, 1) for s in (0, 1)],
        sealed(1005, 1, r(0, 0, 0)), sealed(1005, 1, r(0, 1, 0)), sealed(1006, 1, r(1, 0, 0)),
        trained(1007, 1, 1, 0),
        cut(1007.5, 1, "trainer_checkpoint", 1, 1007.5, rows=[(1, 0)], groups=[1], next_index=2),
        admitted(1008, 1, 2), sibling(1008, 1, r(2, 0, 0)), sibling(1008, 1, r(2, 1, 0)),
        turn(1009, 1, r(1, 1, 0), 1),
        hold(1010, 1, "taken", SNAPSHOT_1, lease_s=LEASE_S),
        hold(1015, 1, "renewed", SNAPSHOT_1, ["admission"], LEASE_S),
        hold(1015, 1, "renewed", SNAPSHOT_1, ["deadlines"], LEASE_S),
        cut(1016, 1, "snapshot", 1, CUT_1, rows=[(1, 0)], groups=[1, 2], next_index=3,
            continuations=[r(1, 1, 0), r(2, 0, 0), r(2, 1, 0)]),
        SnapshotPublished(t=1017, inc=1, checkpoint_id="r.snapshot.1.1", step=1, snapshot_dir="s1", cut_unix_s=CUT_1),
        hold(1017.5, 1, "released", SNAPSHOT_1),
        turn(1019, 1, r(1, 1, 0), 2), sealed(1020, 1, r(1, 1, 0)),
        trained(1021, 1, 2, 1),
        # Started at 1008, parked 1010 to 1017.5: 15.5 s of its 15 s budget had run by 1031.
        DeadlineExpired(t=1031, inc=1, rollout_id=r(2, 1, 0), budget_s=15.0, running_s=15.0),
        SiblingFailed(t=1031, inc=1, rollout_id=r(2, 1, 0), group_id=g(2), sibling=1, attempt=0,
                      reason="timed_out", will_retry=True),
        sibling(1031.5, 1, r(2, 1, 1)),
    ]


def incarnation_2() -> list:
    return [
        started(1100, 2, True),
        hold(1101, 2, "taken", "recovery:2", ["admission"]),
        restored(1102, 2, 1, CUT_1, rows=[(1, 0)], unfinished=[1, 2], next_index=3,
                 continuations=[continuation(r(1, 1, 0), "abc")], not_continued=[r(2, 0, 0), r(2, 1, 0)]),
        hold(1104, 2, "released", "recovery:2", ["admission"]),
        sibling(1104.1, 2, r(1, 1, 1), resumed_from=r(1, 1, 0), resumed_turn=1),
        sibling(1104.1, 2, r(2, 0, 1)), sibling(1104.1, 2, r(2, 1, 1)),
        turn(1105, 2, r(1, 1, 1), 2), sealed(1106, 2, r(1, 1, 1), resumed_turn=1, prefix_sha="abc"),
        trained(1107, 2, 2, 1),
        cut(1107.5, 2, "trainer_checkpoint", 2, 1107.5, rows=[], groups=[2], next_index=3),
        admitted(1108, 2, 3), sibling(1108, 2, r(3, 0, 0)), sibling(1108, 2, r(3, 1, 0)),
        sealed(1109, 2, r(2, 0, 1)), sealed(1109.5, 2, r(3, 0, 0)), sealed(1110, 2, r(2, 1, 1)),
        trained(1111, 2, 3, 2),
        GroupRerun(t=1112, inc=2, group_id=g(3), round=1, cause="group_scored_failure", reason="sibling 1 failed",
                   discarded_siblings=[0]),
        sibling(1112, 2, r(3, 0, 1)), sibling(1112, 2, r(3, 1, 1)), sealed(1112.5, 2, r(3, 0, 1)),
        GroupDropped(t=1113, inc=2, group_id=g(3), reason="sibling 1 failed"),
        GroupsDiscarded(t=1114, inc=2, group_ids=[g(3)], reason="too_few_siblings"),
        admitted(1115, 2, 4), sibling(1115, 2, r(4, 0, 0)), sibling(1115, 2, r(4, 1, 0)),
        hold(1116, 2, "taken", SNAPSHOT_2, lease_s=LEASE_S),
        cut(1117, 2, "snapshot", 3, CUT_2, rows=[], groups=[4], next_index=5,
            continuations=[r(4, 0, 0), r(4, 1, 0)]),
        SnapshotPublished(t=1118, inc=2, checkpoint_id="r.snapshot.3.1", step=3, snapshot_dir="s2", cut_unix_s=CUT_2),
        hold(1118.5, 2, "released", SNAPSHOT_2),
        sealed(1119, 2, r(4, 0, 0)),
    ]


def incarnation_3(journal_agent: bool = False) -> list:
    """`journal_agent`: g5's sibling 0 runs a turn and part of the next before the last trainer checkpoint
    (incarnation 4 continues it from the turn journal, cut turn included)."""
    g5_running = [sibling(1207.1, 3, r(5, 0, 0)), turn(1207.2, 3, r(5, 0, 0), 1),
                  TurnTokens(t=1207.3, inc=3, rollout_id=r(5, 0, 0), turn=1, tokens=6, policy_version=4, durable=True),
                  ] if journal_agent else []
    return [
        started(1200, 3, True),
        hold(1201, 3, "taken", "recovery:3", ["admission"]),
        restored(1202, 3, 3, CUT_2, rows=[], unfinished=[4], next_index=5,
                 continuations=[continuation(r(4, 0, 0), "b40"), continuation(r(4, 1, 0), "b41")]),
        hold(1203, 3, "released", "recovery:3", ["admission"]),
        sibling(1203.1, 3, r(4, 0, 1), resumed_from=r(4, 0, 0), resumed_turn=1),
        sibling(1203.1, 3, r(4, 1, 1), resumed_from=r(4, 1, 0), resumed_turn=1),
        turn(1204, 3, r(4, 0, 1), 2), turn(1204, 3, r(4, 1, 1), 2),
        sealed(1205, 3, r(4, 0, 1), resumed_turn=1, prefix_sha="b40"),
        sealed(1205, 3, r(4, 1, 1), resumed_turn=1, prefix_sha="b41"),
        trained(1206, 3, 4, 4),
        admitted(1207, 3, 5), *g5_running,
        cut(1207.5, 3, "trainer_checkpoint", 4, 1207.5, rows=[], groups=[5], next_index=6),
        ended(1210, 3, 4, outstanding=[5]),
    ]


def incarnation_4() -> list:
    """Restored from the trainer checkpoint of step 4 (no snapshot): g5's running agent comes from the turn
    journal."""
    restore = restored(1302, 4, 4, 1207.5, rows=[], unfinished=[5], next_index=6,
                       continuations=[continuation(r(5, 0, 0), "b50").model_copy(
                           update={"partial_tokens": PARTIAL_TOKENS})])
    restore = restore.model_copy(update={"source": SourceKind.TRAINER_CHECKPOINT, "snapshot_dir": None,
                                         "reason": "no published snapshot under checkpoints/step_4",
                                         "agents_from": AgentsFrom.JOURNAL, "kept_after_cut": KeptAfterCut(
                                             records=0, undone_steps=[], newest_policy_version=4,
                                             journal="journal/inc-000003")})
    return [
        started(1300, 4, True),
        hold(1301, 4, "taken", "recovery:4", ["admission"]),
        restore,
        hold(1303, 4, "released", "recovery:4", ["admission"]),
        sibling(1303.1, 4, r(5, 0, 1), resumed_from=r(5, 0, 0), resumed_turn=1), sibling(1303.1, 4, r(5, 1, 0)),
        turn(1304, 4, r(5, 0, 1), 2), sealed(1305, 4, r(5, 0, 1), resumed_turn=1, prefix_sha="b50"),
        turn(1304.5, 4, r(5, 1, 0), 1), turn(1305, 4, r(5, 1, 0), 2), sealed(1305.5, 4, r(5, 1, 0)),
        trained(1306, 4, 5, 5),
        ended(1310, 4, 5),
    ]


def healthy() -> list:
    return incarnation_1() + incarnation_2() + incarnation_3()


def healthy_with_a_journal_restore() -> list:
    """`healthy`, then a fourth incarnation restored from a trainer checkpoint with its agent from a turn journal."""
    return incarnation_1() + incarnation_2() + incarnation_3(journal_agent=True) + incarnation_4()


def replace(events: list, match, *new) -> list:
    """`events` with the one event `match(event)` picks replaced by `new` (nothing: removed)."""
    [index] = [i for i, e in enumerate(events) if match(e)]
    return events[:index] + list(new) + events[index + 1:]


def insert_before(events: list, match, *new) -> list:
    [index] = [i for i, e in enumerate(events) if match(e)]
    return events[:index] + list(new) + events[index:]


def without_new_events(events: list) -> list:
    """The same run as a log written before `cut_taken`, `hold_changed`, `group_dropped` and
    `restored.agents_not_continued` existed."""
    return [e.model_copy(update={"agents_not_continued": []}) if isinstance(e, Restored) else e
            for e in events if e.event not in ("cut_taken", "hold_changed", "group_dropped")]


def broken(verdict, number: int, name: str) -> list[str]:
    """The violations of one check, which must have failed (and show as broken in the table)."""
    result = verdict.result(number, name)
    assert verdict.ok is False and result.ok is False, verdict.format()
    assert not result.unchecked
    assert any(line.startswith("INVARIANT BROKEN") and name in line for line in verdict.format().splitlines())
    return result.violations


def is_event(kind, **fields):
    """A matcher for `replace` and `insert_before`: an event of type `kind` with these field values."""
    return lambda e: isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items())
