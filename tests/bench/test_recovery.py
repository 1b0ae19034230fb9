"""The age of each turn a crash took, read from an audit log; a chaos directory that is no finished run."""

from __future__ import annotations

import argparse

import orjson
import pytest

from tests.chaos.invariants.history import admitted, r, started, turn
from turnkeep.bench import recovery
from turnkeep.bench.recovery import lost_turn_ages


def test_only_turns_a_later_incarnation_committed_again_have_an_age_from_their_incarnations_last_event():
    events = [
        started(100, 1, False), admitted(101, 1, 0),
        turn(102, 1, r(0, 0, 0), 1), turn(104, 1, r(0, 0, 0), 2), turn(105, 1, r(0, 1, 0), 1),
        turn(105.5, 1, r(0, 1, 0), 2),  # kept by the restore: never committed again
        started(200, 2, True),
        turn(202, 2, r(0, 0, 1), 2), turn(203, 2, r(0, 1, 1), 1), turn(204, 2, r(0, 1, 1), 3),
    ]
    assert sorted(lost_turn_ages(events)) == pytest.approx([0.5, 1.5])


def test_a_run_that_lost_nothing_has_no_ages():
    events = [started(100, 1, False), turn(102, 1, r(0, 0, 0), 1), started(200, 2, True), turn(202, 2, r(0, 0, 1), 2)]
    assert lost_turn_ages(events) == []


def test_a_chaos_run_that_never_finished_is_named_in_one_line(tmp_path):
    (tmp_path / "chaos").mkdir()
    args = argparse.Namespace(chaos_dir=tmp_path, out=tmp_path / "out", kills=20, set=[])

    with pytest.raises(SystemExit) as exit_:
        recovery.run(args)

    assert str(tmp_path) in str(exit_.value)
    assert "no chaos/report.json" in str(exit_.value)


@pytest.mark.parametrize("body, named", [
    (b'{"verdict": {"counts": {"restores_by_source": {}}}, "kills_by_point": {}}',
     "was written by an older `turnkeep chaos` (its counts lack restart_to_first_generation_s"),
    (b'{"kills_by_point": {}}', "has no 'verdict': not a report of `turnkeep chaos`"),
    (b'{"verdict": ', "is not JSON"),
])
def test_a_report_this_version_cannot_read_is_one_line_naming_what_it_lacks(tmp_path, body, named):
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "report.json").write_bytes(body)
    args = argparse.Namespace(chaos_dir=tmp_path, out=tmp_path / "out", kills=20, set=[])
    with pytest.raises(SystemExit) as exit_:
        recovery.run(args)
    message = str(exit_.value)
    assert named in message and "run `turnkeep chaos` again" in message and "\n" not in message, message


def test_the_table_splits_a_restart_at_its_first_train_step(tmp_path):
    counts = {"restart_to_first_generation_s": {"2": 27.0, "3": 29.0}, "restores_by_source": {"snapshot": 2},
              "median_restart_to_first_generation_s": 27.0, "tokens_regenerated": 5, "tokens_generated": 1000,
              "tokens_regenerated_share": 0.005, "continuations_restored": 3, "continuations_sealed": 1}
    report = {"verdict": {"ok": True, "counts": counts}, "kills_by_point": {"random": 2},
              "restart_to_first_step_s": {"all": 19.5}}
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "report.json").write_bytes(orjson.dumps(report))
    (tmp_path / "audit.jsonl").write_bytes(b"")
    result = recovery.run(argparse.Namespace(chaos_dir=tmp_path, out=tmp_path / "out", kills=2, set=[]))
    assert "| restart -> first train step, median s (by what was killed) | all 19.5 |" in result.table
    assert "| restart -> first generation, median s | 27 |" in result.table


def test_a_chaos_run_that_refused_to_start_is_not_read_as_measured(tmp_path, monkeypatch):
    (tmp_path / "chaos" / "chaos").mkdir(parents=True)
    (tmp_path / "chaos" / "chaos" / "report.json").write_bytes(b"{}")  # an older run's, left in --out
    monkeypatch.setattr(recovery.subprocess, "call", lambda command: 2)
    with pytest.raises(SystemExit, match="did not start .*nothing was measured"):
        recovery.run(argparse.Namespace(chaos_dir=None, out=tmp_path, kills=2, set=[]))
