import random
from pathlib import Path

import orjson

from tests.controller.journal.journal_harness import JournaledState
from turnkeep.controller.journal.journal_prune import needed_bases, prune_journals
from turnkeep.controller.journal.replay import resolve_state
from turnkeep.controller.journal.state_journal import write_base
from turnkeep.primitives.atomic_files import atomic_write_bytes
from turnkeep.primitives.segment_format import first_seq


def _file_snapshot(run_dir: Path, step: int, saved: dict) -> Path:
    path = run_dir / "checkpoints" / f"step_{step}" / "snapshots" / "1" / "controller" / "state.json"
    path.parent.mkdir(parents=True)
    atomic_write_bytes(path, orjson.dumps(saved))
    return path


def _busy(state: JournaledState, rng: random.Random, changes: int) -> None:
    for _ in range(changes):
        state.random_change(rng)
    state.journal.sync_blocking()


def test_a_journal_stays_while_a_kept_snapshot_replays_it_and_goes_after(tmp_path):
    rng = random.Random(1)
    first = JournaledState()
    first.start(tmp_path, 1, segment_bytes=4096)
    _busy(first, rng, 300)
    old_cut, old_live = first.cut()
    first.journal.sync_blocking()
    first.journal.close()
    snapshot = _file_snapshot(tmp_path, 5, old_cut)

    second = JournaledState()  # the next incarnation, after a restore
    journal = second.start(tmp_path, 2, segment_bytes=4096)
    for round_ in range(3):  # trainer checkpoints: each a new base, then pruning
        _busy(second, rng, 400)
        position = journal.sync_blocking()
        base = tmp_path / "checkpoints" / f"step_{10 + round_}" / "controller_state.json"
        base.parent.mkdir(parents=True)
        write_base(base, second.comparable(), journal, position)
        journal.rebase(base, position)
        prune_journals(tmp_path, journal)

    assert needed_bases(tmp_path) == {"journal/inc-000001": 0}
    assert resolve_state(tmp_path, old_cut)["data_plane"] == old_live["data_plane"]  # still replayable
    assert first_seq(journal.directory) > 0  # the current journal lost its oldest segments
    assert first_seq(journal.directory) <= journal.keep_from_seq
    newest_cut, newest_live = second.cut()
    journal.sync_blocking()
    assert resolve_state(tmp_path, newest_cut)["data_plane"] == newest_live["data_plane"]

    snapshot.unlink()  # its checkpoint was pruned
    removed = prune_journals(tmp_path, journal)
    assert tmp_path / "journal" / "inc-000001" in removed
    assert not (tmp_path / "journal" / "inc-000001").exists() and journal.directory.exists()


def test_a_snapshot_being_written_keeps_its_journal(tmp_path):
    state = JournaledState()
    state.start(tmp_path, 1)
    _busy(state, random.Random(2), 100)
    saved, _ = state.cut()
    staging = tmp_path / "checkpoints" / "step_3" / "snapshots" / ".staging-1-abc" / "controller" / "state.json"
    staging.parent.mkdir(parents=True)
    atomic_write_bytes(staging, orjson.dumps(saved))
    assert needed_bases(tmp_path) == {"journal/inc-000001": 0}
