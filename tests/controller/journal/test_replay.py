import asyncio
import random
from pathlib import Path

import orjson
import pytest

from tests.controller.journal.journal_harness import JournaledState, make_row
from turnkeep.controller.journal.replay import resolve_state, state_at
from turnkeep.controller.journal.state_journal import JournalRef
from turnkeep.primitives.segment_format import JournalCorrupt


def _journaled_cuts(run_dir: Path, seed: int, changes: int, cuts_every: int, segment_bytes: int = 64 << 20):
    rng = random.Random(seed)
    state = JournaledState()
    journal = state.start(run_dir, 1, segment_bytes=segment_bytes)
    cuts = []
    for i in range(changes):
        state.random_change(rng)
        if i % cuts_every == cuts_every - 1:
            cuts.append(state.cut())
            journal.sync_blocking()  # one batch per cut, so segments rotate between them
    journal.sync_blocking()
    return state, journal, cuts


def test_every_cut_replays_to_exactly_the_state_the_controller_held_then(tmp_path):
    state, journal, cuts = _journaled_cuts(tmp_path, seed=1, changes=3000, cuts_every=97, segment_bytes=16 << 10)
    assert len(list((tmp_path / "journal" / "inc-000001").glob("*.seg"))) > 5  # rotations happened
    assert any(live["data_plane"]["rows"] for _, live in cuts)
    for saved, live in cuts:
        replayed = resolve_state(tmp_path, saved)
        assert {k: replayed[k] for k in live} == live
        assert replayed["step"] == saved["step"]


def test_a_replay_that_does_not_reach_the_cuts_rows_is_refused(tmp_path):
    state, journal, cuts = _journaled_cuts(tmp_path, seed=2, changes=800, cuts_every=200)
    saved, live = next((s, lv) for s, lv in reversed(cuts) if lv["data_plane"]["rows"])
    ref = JournalRef.model_validate(saved["journal_ref"])
    assert state_at(tmp_path, ref)["data_plane"]["rows"] == live["data_plane"]["rows"]
    with pytest.raises(JournalCorrupt, match="does not hold what the cut saw"):
        state_at(tmp_path, ref.model_copy(update={"rows_digest": "0" * 24}))
    with pytest.raises(JournalCorrupt, match="does not hold what the cut saw"):
        state_at(tmp_path, ref.model_copy(update={"rows": ref.rows + 1}))


def test_a_record_damaged_in_the_middle_fails_the_replay_naming_the_file(tmp_path):
    state, journal, cuts = _journaled_cuts(tmp_path, seed=3, changes=600, cuts_every=600)
    saved, _ = cuts[-1]
    segment = sorted((tmp_path / "journal" / "inc-000001").glob("*.seg"))[-1]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt, match=segment.name):
        resolve_state(tmp_path, saved)


def test_a_torn_tail_after_the_cut_changes_nothing(tmp_path):
    state, journal, cuts = _journaled_cuts(tmp_path, seed=4, changes=500, cuts_every=500)
    journal.close()
    saved, live = cuts[-1]
    segment = sorted((tmp_path / "journal" / "inc-000001").glob("*.seg"))[-1]
    with segment.open("ab") as f:
        f.write(b"\x00\x00\x10\x00garbage")  # a record header whose payload never made it
    replayed = resolve_state(tmp_path, saved)
    assert {k: replayed[k] for k in live} == live


def test_a_base_replaced_after_the_cut_is_refused(tmp_path):
    state, journal, cuts = _journaled_cuts(tmp_path, seed=5, changes=300, cuts_every=300)
    saved, _ = cuts[-1]
    base = tmp_path / saved["journal_ref"]["base"]
    raw = orjson.loads(base.read_bytes())
    raw["journal_base"]["log_id"] = "run-other/inc-1"
    base.write_bytes(orjson.dumps(raw))
    with pytest.raises(JournalCorrupt, match="not the base the cut named"):
        resolve_state(tmp_path, saved)


def test_a_full_state_from_before_journals_still_loads(tmp_path):
    state = JournaledState()
    state.data_plane.put(make_row("g0000001", 0, 0, random.Random(0)))
    full = {**state.comparable(), "cut_unix_s": 1.0, "continuations": []}
    assert resolve_state(tmp_path, full) == full


def test_a_cut_under_load_holds_every_row_sealed_before_it_exactly_once(tmp_path):
    """Sealers race the cuts: each cut's replay has exactly the rows stored before its position, none after."""
    state = JournaledState()
    state.start(tmp_path, 1, segment_bytes=32 << 10)
    rng = random.Random(6)
    stored: list[str] = []  # row keys in the order they were stored, under the barrier
    cuts: list[tuple[dict, int]] = []

    async def sealer(worker: int) -> None:
        for n in range(60):
            group_id = f"g{worker:03d}{n:04d}"
            state.ledger.admit(group_id, state.dataloader.next_group()[1], 1)
            state.ledger.start_attempt(group_id, 0)
            await asyncio.sleep(rng.random() * 0.002)
            async with state.data_plane.barrier:
                state.data_plane.put(make_row(group_id, 0, 0, rng))
                state.ledger.seal(group_id, 0)
                stored.append(f"{group_id}.0")
                seq = state.data_plane.last_record
            await state.data_plane.journal.durable(seq)  # as the pump does before its ACK

    async def cutter() -> None:
        for _ in range(25):
            await asyncio.sleep(rng.random() * 0.01)
            async with state.data_plane.barrier:
                saved, _ = state.cut()
                cuts.append((saved, len(stored)))
            await state.data_plane.journal.durable(saved["journal_ref"]["position"]["seq"])

    async def main() -> None:
        await asyncio.gather(cutter(), *(sealer(w) for w in range(8)))

    asyncio.run(main())
    assert 0 < cuts[0][1] < len(stored) or 0 < cuts[-1][1] < len(stored)
    for saved, count in cuts:
        rows = resolve_state(tmp_path, saved)["data_plane"]["rows"]
        keys = [f"{r['group_id']}.{r['sibling']}" for r in rows]
        assert len(keys) == len(set(keys))
        assert sorted(keys) == sorted(stored[:count])


def _rolled(run_dir: Path, saved: dict):
    from turnkeep.controller.journal.replay import replay_to, roll_past_cut

    ref = JournalRef.model_validate(saved["journal_ref"])
    replay = replay_to(run_dir, ref)
    past = roll_past_cut(run_dir, ref, replay)
    return replay.state_dict(), past


def _expected_past(state: JournaledState, saved: dict) -> dict:
    """The controller's final state with every train step after the cut undone, from what the harness saw."""
    final = state.comparable()
    lost = [(step, gid, entry, rows) for step, gid, entry, rows in state.trained if step > saved["step"]]
    final["step"] = saved["step"]
    final["data_plane"]["rows"] += [row for *_, rows in lost for row in rows]
    final["group_ledger"]["groups"] += [entry for _, _, entry, _ in lost]
    final["replay_batches"] = [[gid] for _, gid, _, _ in lost]
    return final


def _comparable(state: dict) -> dict:
    groups = sorted(state["group_ledger"]["groups"], key=lambda g: g["group_id"])
    rows = sorted(state["data_plane"]["rows"], key=lambda r: (r["group_id"], r["sibling"]))
    return {**state, "group_ledger": {"groups": groups}, "data_plane": {"rows": rows}}


def test_past_the_cut_every_change_is_kept_and_every_later_train_step_is_undone(tmp_path):
    state, journal, cuts = _journaled_cuts(tmp_path, seed=5, changes=2500, cuts_every=300, segment_bytes=16 << 10)
    checked = 0
    for saved, _ in cuts:
        rolled, past = _rolled(tmp_path, saved)
        expected = _expected_past(state, saved)
        assert past.stopped is None
        assert [s["groups"] for s in past.lost_steps] == expected["replay_batches"]
        assert _comparable(rolled) == _comparable({k: expected[k] for k in rolled})
        checked += bool(past.lost_steps)
    assert checked >= 3  # cuts with train steps after them


def test_past_the_cut_for_a_surviving_trainer_every_train_step_is_kept_and_the_state_is_the_controllers_last(tmp_path):
    """A controller that died alone left the trainer at the journal's last step: rolled on with the steps kept, the
    state is exactly what the controller held at the end (step included), and every step after the cut is listed."""
    from turnkeep.controller.journal.replay import replay_to, resolve_state_past_cut, roll_past_cut

    state, journal, cuts = _journaled_cuts(tmp_path, seed=5, changes=2500, cuts_every=300, segment_bytes=16 << 10)
    final = state.comparable()
    checked = 0
    for saved, _ in cuts:
        ref = JournalRef.model_validate(saved["journal_ref"])
        replay = replay_to(tmp_path, ref)
        past = roll_past_cut(tmp_path, ref, replay, keep_steps=True)
        rolled = replay.state_dict()
        assert past.stopped is None and past.lost_steps == []
        assert [s["step"] for s in past.kept_steps] == [step for step, *_ in state.trained if step > saved["step"]]
        assert rolled["replay_batches"] == []
        common = set(rolled) & set(final)
        assert {"step", "data_plane", "group_ledger", "dataloader"} <= common
        assert _comparable({k: rolled[k] for k in common}) == _comparable({k: final[k] for k in common})
        # Through the restore's own entry: the snapshot's saved `step` (its cut's) gives way to the journal's.
        resolved, _ = resolve_state_past_cut(tmp_path, saved, keep_steps=True)
        assert "step" in saved and resolved["step"] == final["step"]
        checked += bool(past.kept_steps)
    assert checked >= 3


def test_a_torn_last_record_past_the_cut_is_skipped(tmp_path):
    state, journal, cuts = _journaled_cuts(tmp_path, seed=6, changes=900, cuts_every=300)
    journal.close()
    newest = sorted((tmp_path / "journal" / "inc-000001").glob("*.seg"))[-1]
    whole = newest.read_bytes()
    saved = cuts[0][0]
    full, _ = _rolled(tmp_path, saved)
    newest.write_bytes(whole[:-3])  # the last record loses its end, as a kill mid-write leaves it
    torn, past = _rolled(tmp_path, saved)
    assert past.stopped is None
    assert torn != full  # one change fewer: the torn record is not applied


def test_damage_past_the_cut_keeps_the_changes_before_it_and_says_why(tmp_path):
    state, journal, cuts = _journaled_cuts(tmp_path, seed=7, changes=900, cuts_every=300)
    journal.close()
    newest = sorted((tmp_path / "journal" / "inc-000001").glob("*.seg"))[-1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a record in the middle, with whole records after it
    newest.write_bytes(bytes(data))
    saved = cuts[0][0]
    at_cut = resolve_state(tmp_path, saved)
    rolled, past = _rolled(tmp_path, saved)
    assert past.stopped is not None and newest.name in past.stopped
    assert past.records > 0 and rolled != {**at_cut, "replay_batches": rolled["replay_batches"]}


def _restart_from(state: JournaledState, restored: dict, run_dir: Path, incarnation: int, restored_from: dict):
    """What a restore does with the state it rebuilt: load it and start the next incarnation's journal from it."""
    from turnkeep.controller.journal.state_journal import StateJournal

    state.data_plane.load_state_dict(restored["data_plane"])
    state.ledger.load_state_dict(restored["group_ledger"])
    state.dataloader.load_state_dict(restored["dataloader"])
    state.training.step = restored["step"]
    state.trained = []
    state.journal = StateJournal(run_dir, "run-test", incarnation, state.state_dict(), restored_from=restored_from)
    state.data_plane.journal = state.ledger.journal = state.dataloader.journal = state.journal


def test_a_second_restore_of_the_same_cut_goes_on_from_the_first_restores_journal(tmp_path):
    from turnkeep.controller.journal.replay import resolve_state_past_cut

    state, journal, cuts = _journaled_cuts(tmp_path, seed=8, changes=1200, cuts_every=400)
    journal.close()
    saved = cuts[0][0]
    first, past = resolve_state_past_cut(tmp_path, saved, incarnation=2)
    assert past.journal == "journal/inc-000001" and past.lost_steps
    # Incarnation 2 trains the undone steps again, goes on, and dies before it saves anything.
    _restart_from(state, first, tmp_path, 2, past.restored_from)
    rng = random.Random(9)
    replayed = [batch for batch in first["replay_batches"][:2]]
    for batch in replayed:
        state.train(batch)
    for _ in range(300):
        state.random_change(rng)
    state.journal.sync_blocking()
    state.journal.close()
    # Incarnation 3 restores the same cut: it keeps all of incarnation 2's work, with 2's train steps undone too.
    second, past2 = resolve_state_past_cut(tmp_path, saved, incarnation=3)
    assert past2.journal == "journal/inc-000002" and past2.stopped is None
    expected = state.comparable()
    lost = [(gid, entry, rows) for step, gid, entry, rows in state.trained if step > saved["step"]]
    expected["step"] = saved["step"]
    expected["data_plane"]["rows"] += [row for *_, rows in lost for row in rows]
    expected["group_ledger"]["groups"] += [entry for _, entry, _ in lost]
    assert _comparable({k: second[k] for k in expected}) == _comparable(expected)
    # The undone order: incarnation 2's own steps first (the replayed ones among them), then what it never reached.
    by_step: dict[int, list[str]] = {}
    for step, gid, _, _ in state.trained:
        by_step.setdefault(step, []).append(gid)
    assert [by_step[s] for s in sorted(by_step)][:len(replayed)] == replayed
    trained_by_2 = {gid for groups in by_step.values() for gid in groups}
    not_reached = [left for batch in first["replay_batches"][len(replayed):]
                   if (left := [gid for gid in batch if gid not in trained_by_2])]
    assert second["replay_batches"] == [by_step[s] for s in sorted(by_step)] + not_reached
    # A restore that is itself incarnation 2 (a retried restore) never reads its own, unfinished journal.
    again, past3 = resolve_state_past_cut(tmp_path, saved, incarnation=2)
    assert past3.journal == "journal/inc-000001" and again == first


def test_a_step_the_trainer_took_after_the_journal_is_applied_only_when_it_is_the_next_and_its_rows_are_there(
        tmp_path):
    """The controller died between the trainer's answer and the journal's flush: the surviving trainer's last step
    is applied as the train pump would have (rows deleted, groups finished, the step advanced), if it can be."""
    from turnkeep.controller.journal.replay import replay_to, roll_past_cut, step_past_journal

    state, journal, cuts = _journaled_cuts(tmp_path, seed=9, changes=900, cuts_every=300)
    saved = cuts[0][0]

    def rolled():
        ref = JournalRef.model_validate(saved["journal_ref"])
        replay = replay_to(tmp_path, ref)
        roll_past_cut(tmp_path, ref, replay, keep_steps=True)
        return replay

    replay = rolled()
    with_rows = [gid for gid, rows in replay.rows.items() if rows][:2]
    assert len(with_rows) == 2
    kept_before, step = list(replay.kept_steps), replay.step
    assert not step_past_journal(replay, {"step": step + 2, "groups": with_rows})  # not the journal's next step
    assert not step_past_journal(replay, {"step": step + 1, "groups": [*with_rows, "g-never-seen"]})  # no rows
    assert replay.step == step and replay.kept_steps == kept_before
    assert step_past_journal(replay, {"step": step + 1, "groups": with_rows})
    after = replay.state_dict()
    assert after["step"] == step + 1 and replay.kept_steps[-1]["groups"] == with_rows
    assert not {row["group_id"] for row in after["data_plane"]["rows"]} & set(with_rows)
    assert not {g["group_id"] for g in after["group_ledger"]["groups"]} & set(with_rows)
