"""The train pump's checkpoint requests: none is dropped, whatever it races."""

from __future__ import annotations

import asyncio

from turnkeep.controller.journal.records import ROWS_DELETED
from turnkeep.controller.pumps.train_pump import TrainPump
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.config import TrainConfig
from turnkeep.schemas.names import REPLAY_HOLDER


def _pump(written: list, announced: list) -> TrainPump:
    async def write(step: int, trigger: str) -> None:
        written.append((step, trigger))

    async def announce(step: int, trigger: str, repeat: bool) -> None:
        announced.append((step, trigger, repeat))
        assert pump.checkpointed_step == step  # recorded before the attempt it starts can ask for the anchor

    # Serving a request touches only the checkpoint callbacks; the rest is never reached.
    pump = TrainPump(None, None, None, None, None, None, None, None, on_groups_finished=lambda: None,
                     write_checkpoint=write, announce_checkpoint=announce, on_step=lambda report: None)
    return pump


def test_a_request_at_an_unsaved_step_writes_a_checkpoint_under_its_trigger():
    written, announced = [], []
    pump = _pump(written, announced)
    pump.step = 7
    pump.request_checkpoint("preemption")
    asyncio.run(pump._serve_checkpoint_request())
    assert written == [(7, "preemption")] and announced == [(7, "preemption", False)]
    assert pump.has_checkpoint_of_current_step()


def test_a_request_that_raced_a_checkpoint_of_the_same_step_is_announced_again():
    written, announced = [], []
    pump = _pump(written, announced)
    pump.restore(12, policy_version=12)  # step 12 is checkpointed already, as after a save_period checkpoint
    pump.request_checkpoint("preemption")
    asyncio.run(pump._serve_checkpoint_request())
    assert written == [] and announced == [(12, "preemption", True)]
    asyncio.run(pump._serve_checkpoint_request())
    assert announced == [(12, "preemption", True)]  # served once


def test_a_frozen_pump_starts_no_step_but_still_writes_a_requested_checkpoint():
    written, announced = [], []
    pump = _pump(written, announced)
    pump.step = 9

    async def scenario():
        pump.freeze()
        claim = asyncio.create_task(pump._claim_batch())  # a step would start once it returned groups
        await asyncio.sleep(0.05)
        pump.request_checkpoint("preemption")
        await asyncio.sleep(0.05)
        pump.group_settled("g1", True)  # a group that completes meanwhile starts nothing either
        await asyncio.sleep(0.05)
        still_waiting = not claim.done()
        claim.cancel()
        return still_waiting

    assert asyncio.run(scenario())
    assert written == [(9, "preemption")] and announced == [(9, "preemption", False)]


class _Records:
    started = True

    def __init__(self) -> None:
        self.kinds: list[str] = []

    def record(self, kind, value) -> int:
        self.kinds.append(kind)
        return len(self.kinds)


def _replaying_pump(batches: list[list[str]], open_groups: list[str],
                    max_staleness: int = 2, prompts_per_step: int = 1) -> tuple[TrainPump, _Records]:
    from turnkeep.controller.state.data_plane import DataPlane
    from turnkeep.controller.state.group_ledger import GroupLedger
    from turnkeep.schemas.rollout import Problem

    ledger, data_plane, records = GroupLedger(), DataPlane(), _Records()
    data_plane.journal = records
    for gid in open_groups:
        ledger.admit(gid, Problem(question="Q 1+1", answer=2), 1)
    pump = TrainPump(TrainConfig(max_staleness=max_staleness, prompts_per_step=prompts_per_step), ledger, None,
                     data_plane, None, None,
                     HoldSet("admission"), None, on_groups_finished=lambda: None, write_checkpoint=None,
                     announce_checkpoint=None, on_step=lambda report: None)
    pump.replay_batches.extend(batches)
    return pump, records


def test_undone_steps_train_again_first_in_their_order_without_the_groups_that_ended_since():
    pump, records = _replaying_pump([["g1", "g2"], ["g3"], ["g9"], ["g4"]], ["g1", "g2", "g3", "g4", "g5"])
    complete = ["g5", "g4", "g3", "g2", "g1"]
    assert pump._next_replay_batch(complete) == ["g1", "g2"]
    assert pump._next_replay_batch(complete) == ["g3"]
    assert pump._next_replay_batch(complete) == ["g4"]  # g9 was discarded after the restore: its batch is empty
    assert pump._next_replay_batch(complete) is None and records.kinds == []


def test_a_replayed_group_that_is_not_complete_ends_the_replay_and_says_so_in_the_journal():
    pump, records = _replaying_pump([["g1"], ["g2", "g3"], ["g4"]], ["g1", "g2", "g3", "g4"])
    assert pump._next_replay_batch(["g1", "g2", "g4"]) == ["g1"]
    assert pump._next_replay_batch(["g2", "g4"]) is None  # g3 was rerun and is running again
    assert not pump.replay_batches and records.kinds == ["replay_cleared"]


def _train_replayed(pump: TrainPump, complete: list[str], expected: list[str]) -> None:
    """What a replayed step does to the ledger and the hold: its groups finish, then the refit lets the hold go."""
    batch = pump._next_replay_batch(complete)
    assert batch == expected
    pump._ledger.finish(batch)
    pump._release_replay_hold_once_fresh()


def test_admission_waits_while_more_undone_steps_are_left_than_max_staleness():
    """Chaos27: a restore to step 100 with steps 101-103 undone continued agents with policy 100 right away; their
    groups were complete at step 103 with staleness 3 > 2 and discarded whole, turns kept from the kill included."""
    batches = [["g1"], ["g2"], ["g9"], ["g3"], ["g4"]]  # g9 ended since: its step is not left to train
    pump, _ = _replaying_pump(batches, ["g1", "g2", "g3", "g4"], max_staleness=2)
    admission = pump._admission
    pump.hold_generation_during_replay()
    assert admission.holders() == {REPLAY_HOLDER}
    complete = ["g1", "g2", "g3", "g4"]
    _train_replayed(pump, complete, ["g1"])
    assert admission.holders() == {REPLAY_HOLDER}  # g2, g3, g4: three steps, still one too many
    _train_replayed(pump, complete, ["g2"])
    assert admission.is_clear()  # a turn generated with the next policy is 2 behind when g4's step is done


def test_the_groups_already_open_keep_admission_closed_until_the_replay_leaves_them_room():
    """Chaos30, with the hold lifted at max_staleness steps left: 48 open groups, continued at once with policy 105
    while steps 106-107 were trained again, could only be trained at step 108 (16 a step); 16 were discarded."""
    others = [f"o{i}" for i in range(4)]  # two steps' worth at 2 a step
    pump, _ = _replaying_pump([["g1"], ["g2"], ["g3"]], ["g1", "g2", "g3", *others], max_staleness=2,
                              prompts_per_step=2)
    pump.hold_generation_during_replay()
    complete = ["g1", "g2", "g3", *others]
    _train_replayed(pump, complete, ["g1"])
    assert pump._admission.holders() == {REPLAY_HOLDER}  # 2 undone + 2 for the others > 3 steps a turn has
    _train_replayed(pump, complete, ["g2"])
    assert pump._admission.is_clear()  # 1 + 2 steps: a turn of the policy after g2's step is trained in time
    pump, _ = _replaying_pump([["g1"]], ["g1", *[f"o{i}" for i in range(9)]], max_staleness=2, prompts_per_step=2)
    pump.hold_generation_during_replay()
    assert pump._admission.holders() == {REPLAY_HOLDER}
    _train_replayed(pump, ["g1"], ["g1"])
    assert pump._admission.is_clear()  # no undone step left: the newest policy, nothing to wait for


def test_a_replay_within_max_staleness_never_closes_admission_and_one_that_ends_early_opens_it():
    pump, _ = _replaying_pump([["g1"], ["g2"]], ["g1", "g2"], max_staleness=2)
    pump.hold_generation_during_replay()
    assert pump._admission.is_clear()
    pump, records = _replaying_pump([["g1"], ["g2"], ["g3"], ["g4"]], ["g1", "g2", "g3", "g4"], max_staleness=1)
    pump.hold_generation_during_replay()
    assert pump._admission.holders() == {REPLAY_HOLDER}
    assert pump._next_replay_batch(["g2", "g3"]) is None  # g1 is running again: the replay ends, and so does the hold
    assert pump._admission.is_clear() and records.kinds == ["replay_cleared"]


def test_a_step_takes_the_groups_nearest_to_going_stale_first():
    """Chaos30: after a replay, a group continued with policy 105 waited behind groups of policy 106-107 admitted
    before it, and was discarded as stale one step later."""
    from tests.controller.state.test_data_plane import make_row
    from turnkeep.controller.state.claim_ledger import ClaimLedger
    from turnkeep.controller.state.data_plane import DataPlane
    from turnkeep.controller.state.group_ledger import GroupLedger
    from turnkeep.controller.state.run_stats import RunStats
    from turnkeep.schemas.rollout import Problem

    ledger, data_plane = GroupLedger(min_sealed=1), DataPlane()
    data_plane.journal = _Records()
    for gid, version in (("g1", 107), ("g2", 105), ("g3", 106), ("g4", 104), ("g5", 105)):  # in admission order
        ledger.admit(gid, Problem(question="Q 1+1", answer=2), 1)
        ledger.start_attempt(gid, 0)
        ledger.seal(gid, 0)
        assert ledger.settle(gid)
        data_plane.put(make_row(gid, 0, version=version))
    stats = RunStats()
    pump = TrainPump(TrainConfig(max_staleness=2), ledger, ClaimLedger(), data_plane, None, None,
                     HoldSet("admission"), stats, on_groups_finished=lambda: None, write_checkpoint=None,
                     announce_checkpoint=None, on_step=lambda report: None)
    pump.step = 107
    assert asyncio.run(pump._drop_unusable_groups()) == ["g2", "g5", "g3", "g1"]
    assert stats.groups_discarded == {"stale": 1} and not ledger.has_group("g4")


def test_a_discard_is_in_the_audit_log_on_disk_before_the_journal_records_it(tmp_path):
    """Chaos (token level): a kill between the two left a restore that kept a journaled discard whose audit line
    was still buffered, and the checker took the discarded group for a lost one."""
    from tests.controller.state.test_data_plane import make_row
    from turnkeep.controller.state.claim_ledger import ClaimLedger
    from turnkeep.controller.state.data_plane import DataPlane
    from turnkeep.controller.state.group_ledger import GroupLedger
    from turnkeep.controller.state.run_stats import RunStats
    from turnkeep.primitives.audit_log import AUDIT_FILE, AuditLog
    from turnkeep.schemas.rollout import Problem

    audit = AuditLog(tmp_path / AUDIT_FILE, 1, flush_interval_s=3600)

    class _SeenOnDisk(_Records):
        def record(self, kind, value) -> int:
            if kind == "rows_deleted":
                self.on_disk = (tmp_path / AUDIT_FILE).read_text()
            return super().record(kind, value)

    ledger, data_plane = GroupLedger(min_sealed=1), DataPlane()
    data_plane.journal = records = _SeenOnDisk()
    ledger.admit("g1", Problem(question="Q 1+1", answer=2), 1)
    ledger.start_attempt("g1", 0)
    ledger.seal("g1", 0)
    assert ledger.settle("g1")
    data_plane.put(make_row("g1", 0, version=3))
    pump = TrainPump(TrainConfig(max_staleness=2), ledger, ClaimLedger(), data_plane, None, None,
                     HoldSet("admission"), RunStats(), on_groups_finished=lambda: None, write_checkpoint=None,
                     announce_checkpoint=None, on_step=lambda report: None, audit=audit)
    pump.step = 9
    assert asyncio.run(pump._drop_unusable_groups()) == []
    assert '"event":"groups_discarded"' in records.on_disk and '"g1"' in records.on_disk


def test_dynamic_sampling_discards_groups_whose_rewards_are_all_equal_once_and_counts_them():
    from tests.controller.state.test_data_plane import make_row
    from turnkeep.controller.state.claim_ledger import ClaimLedger
    from turnkeep.controller.state.data_plane import DataPlane
    from turnkeep.controller.state.group_ledger import GroupLedger
    from turnkeep.controller.state.run_stats import RunStats
    from turnkeep.schemas.rollout import Problem

    ledger, data_plane = GroupLedger(min_sealed=2), DataPlane()
    data_plane.journal = _Records()
    for gid, rewards in (("g1", (1.0, 0.0)), ("g2", (1.0, 1.0)), ("g3", (0.0, 0.0)), ("g4", (0.5, 0.0))):
        ledger.admit(gid, Problem(question="Q 1+1", answer=2), 2)
        for sibling, reward in enumerate(rewards):
            ledger.start_attempt(gid, sibling)
            ledger.seal(gid, sibling)
            data_plane.put(make_row(gid, sibling, reward=reward, version=5))
        assert ledger.settle(gid)
    stats = RunStats()
    pump = TrainPump(TrainConfig(max_staleness=2), ledger, ClaimLedger(), data_plane, None, None,
                     HoldSet("admission"), stats, on_groups_finished=lambda: None, write_checkpoint=None,
                     announce_checkpoint=None, on_step=lambda report: None, drop_zero_signal=True)
    pump.step = 5
    assert asyncio.run(pump._drop_unusable_groups()) == ["g1", "g4"]
    assert stats.groups_discarded == {"zero_signal": 2} and not ledger.has_group("g2") and not ledger.has_group("g3")
    assert data_plane.rows("g2") == [] and data_plane.journal.kinds.count(ROWS_DELETED) == 1  # journaled: crash-safe
    assert asyncio.run(pump._drop_unusable_groups()) == ["g1", "g4"]  # ended once: not discarded again
    assert stats.groups_discarded == {"zero_signal": 2}


def test_a_steps_reward_parts_are_each_parts_mean_over_the_rows_that_have_it(tmp_path) -> None:
    from turnkeep.controller.pumps.train_pump import StepReport, reward_parts_mean
    from turnkeep.controller.state.run_stats import RunStats
    from turnkeep.controller.stores.metrics import MetricsSink
    from turnkeep.schemas.rollout import RolloutRow

    def row(**parts: float) -> RolloutRow:
        return RolloutRow(group_id="g", sibling=0, attempt=0, segments=[], reward=1.0, reward_parts=parts,
                          num_turns=1)

    means = reward_parts_mean([row(format=1.0, correct=0.0), row(format=0.0, correct=1.0), row(format=0.5), row()])
    assert means == {"correct": 0.5, "format": 0.5}
    with open(tmp_path / "progress.txt", "w") as out:
        sink = MetricsSink(tmp_path, RunStats(), max_steps=None, out=out)
        line = sink.step(StepReport(step=1, reward_mean=0.5, train_step_s=0.1, refit_s=0.1, refit_bytes=1,
                                    groups_trained=1, policy_version=1, staleness_max=0, trainer={},
                                    reward_parts_mean=means))
        plain = sink.step(StepReport(step=2, reward_mean=0.5, train_step_s=0.1, refit_s=0.1, refit_bytes=1,
                                     groups_trained=1, policy_version=2, staleness_max=0, trainer={}))
    assert line["reward_parts_mean"] == {"correct": 0.5, "format": 0.5} and "reward_parts_mean" not in plain
