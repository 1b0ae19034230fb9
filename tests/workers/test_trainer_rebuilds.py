"""How many times in a row a dead trainer is rebuilt: an incarnation that trained a step starts the count again;
rebuilds that die before a train step add up until `train.max_rebuilds`, then the run stops with one line."""

import orjson

from turnkeep.workers.trainer_rebuilds import TrainerLost, TrainerRebuilds

REASON = "the trainer process died (killed); run the same command again (same --run-dir) to continue"


def test_a_trainer_that_trained_between_deaths_is_rebuilt_every_time():
    rebuilds = TrainerRebuilds(allowed=1)
    for _ in range(5):
        assert rebuilds.permits(steps_trained=3)
        assert rebuilds.take(steps_trained=3) == 1


def test_rebuilds_that_die_before_a_step_stop_the_run_after_max_rebuilds():
    rebuilds = TrainerRebuilds(allowed=2)
    assert rebuilds.take(steps_trained=7) == 1
    assert rebuilds.take(steps_trained=0) == 2  # the first rebuild died before its first step
    assert not rebuilds.permits(steps_trained=0)  # so did the second: none is left
    refusal = rebuilds.refusal(REASON)
    assert refusal == ("the trainer process died (killed), and so did each of the 2 trainer(s) rebuilt in a row "
                       "before it, before a train step (train.max_rebuilds = 2); run the same command again (same "
                       "--run-dir) to continue")
    assert rebuilds.permits(steps_trained=1)  # had it trained a step, it would have gone on


def test_zero_rebuilds_stop_the_run_at_the_first_death_with_its_own_line():
    rebuilds = TrainerRebuilds(allowed=0)
    assert not rebuilds.permits(steps_trained=10)
    assert rebuilds.refusal(REASON) == REASON


def test_the_announcement_names_the_death_and_the_count_without_the_restart_hint():
    rebuilds = TrainerRebuilds(allowed=3)
    lost = TrainerLost(REASON, steps_trained=4)
    rebuilds.take(lost.steps_trained)
    line = rebuilds.announcement(lost)
    assert line.startswith("turnkeep: the trainer process died (killed); rebuilding the trainer")
    assert "(1 of at most 3 in a row)" in line and "same command" not in line


def test_each_rebuild_is_a_metrics_line(tmp_path):
    rebuilds = TrainerRebuilds(allowed=3)
    for steps in (5, 0):
        lost = TrainerLost(REASON, steps_trained=steps)
        rebuilds.take(steps)
        rebuilds.record(tmp_path, lost)
    lines = [orjson.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes().splitlines()]
    assert [(m["kind"], m["rebuild_in_a_row"], m["steps_trained"]) for m in lines] == [
        ("trainer_rebuild", 1, 5), ("trainer_rebuild", 2, 0)]
    assert lines[0]["reason"] == REASON and lines[0]["max_rebuilds"] == 3
