import argparse
import pathlib
import random
import sys
from collections import Counter

import orjson
import pytest

from turnkeep.chaos.incarnation import Incarnation, count_train_steps, one_round
from turnkeep.chaos.report import Round, build_report, format_report
from turnkeep.chaos.runner import run_chaos
from turnkeep.chaos.schedule import ALL_POINTS, kill_schedule, parse_points, point_schedule, random_max_delay_s
from turnkeep.chaos.targets import parse_targets
from turnkeep.chaos.verdict import check_invariants
from turnkeep.cli.chaos import add_chaos_parser
from turnkeep.config.loader import load_config
from turnkeep.primitives.chaos_points import POINTS
from turnkeep.schemas.audit import DeadlineExpired, RunEnded, RunStarted


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_chaos_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["chaos", *argv])


def test_schedule_hits_every_point_before_any_repeats():
    n = len(ALL_POINTS)
    schedule = point_schedule(list(ALL_POINTS), 2 * n + 3, random.Random(7))
    assert len(schedule) == 2 * n + 3
    first, second = schedule[:n], schedule[n:2 * n]
    assert sorted(first) == sorted(ALL_POINTS) and sorted(second) == sorted(ALL_POINTS)
    assert max(Counter(schedule).values()) - min(Counter(schedule).values()) <= 1


def test_schedule_never_starts_with_a_point_a_fresh_run_cannot_reach():
    firsts = {point_schedule(list(ALL_POINTS), 3, random.Random(seed))[0] for seed in range(200)}
    assert "restore" not in firsts and len(firsts) == len(ALL_POINTS) - 1
    assert point_schedule(["restore"], 2, random.Random(0)) == ["restore", "restore"]


def test_schedule_is_reproducible_from_its_seed():
    assert point_schedule(list(ALL_POINTS), 9, random.Random(3)) == point_schedule(list(ALL_POINTS), 9, random.Random(3))


def test_points_are_checked_and_deduplicated():
    assert parse_points("cut, training,cut") == ["cut", "training"]
    with pytest.raises(ValueError, match="unknown"):
        parse_points("cut,nap")
    with pytest.raises(ValueError):
        parse_points(" , ")


def test_parser_defaults():
    args = parse(["--run-dir", "runs/x"])
    assert (args.kills, args.steps, args.phase_timeout_s, args.set) == (20, 200, 300.0, [])
    assert args.points is None and parse_points(args.at) == ["random"] and parse_targets(args.target) == ["all"]
    assert parse_points("training," + ",".join(POINTS)) == ["training", *POINTS]
    assert args.config.name == "tiny.toml" and args.config.is_file()


def test_a_used_run_dir_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("old run")
    assert run_chaos(parse(["--run-dir", str(tmp_path)])) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    assert "not empty" in capsys.readouterr().err


def test_random_moments_span_two_snapshot_intervals_so_some_incarnations_publish():
    tiny = load_config(parse(["--run-dir", "runs/x"]).config)
    # Unset (journaled agents: attempts at checkpoints only), the window is the parked default's, as before.
    assert tiny.snapshot.attempt_interval_s is None and random_max_delay_s(tiny) == 40.0
    assert random_max_delay_s(tiny.model_copy(update={"snapshot": tiny.snapshot.model_copy(
        update={"attempt_interval_s": 3})})) == 12.0
    assert random_max_delay_s(tiny.model_copy(update={"snapshot": tiny.snapshot.model_copy(
        update={"enabled": False})})) == 12.0


@pytest.mark.parametrize("argv, message", [
    (["--max-delay-s", "0.2"], "--max-delay-s 0.2: must be more than 0.5 s"),
    (["--set", "snapshot.interval=5"], "snapshot.interval"),
])
def test_a_bad_window_or_config_is_one_line_and_touches_nothing(tmp_path, capsys, argv, message):
    run_dir = tmp_path / "run"
    assert run_chaos(parse(["--run-dir", str(run_dir), *argv])) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("turnkeep chaos: ") and len(err.strip().splitlines()) == 1
    assert not run_dir.exists()


def test_train_steps_are_counted_without_a_torn_last_line(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert count_train_steps(metrics) == 0
    lines = [{"kind": "train_step", "step": 1}, {"kind": "snapshot"}, {"kind": "train_step", "step": 2}]
    metrics.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines) + b'{"kind": "train_step"')
    assert count_train_steps(metrics) == 2


def _rounds() -> list[Round]:
    return [
        Round(1, "cut", "killed", -9, 40.0, 12, "l1"),
        Round(2, "training", "killed", -9, 30.0, 12, "l2"),
        Round(3, "publish", "timeout", -9, 300.0, 12, "l3"),
        Round(4, "cut", "killed", -9, 20.0, 12, "l4"),
    ]


def _verdict(ok: bool):
    events = [
        RunStarted(t=0, inc=1, run_id="r", pid=1, resumed=False),
        RunEnded(t=5, inc=1, step=1, reason="finished", outstanding_groups=[], admission_holders=[],
                 deadline_holders=[], trainer_holders=[]),
    ]
    if not ok:
        events.insert(1, DeadlineExpired(t=1, inc=1, rollout_id="g1.0.0", budget_s=10, running_s=2))
    return check_invariants(events)


def _report(rounds, final, verdict, problems=()):
    meta = {"run_dir": "/runs/chaos", "seed": 5, "kills_requested": 4}
    return build_report(meta=meta, rounds=rounds, final=final, verdict=verdict, snapshot_problems=list(problems),
                        snapshot_checks=4)


def test_report_of_a_clean_chaos_run():
    verdict = _verdict(ok=True)
    report = _report(_rounds(), Round(5, "none", "finished", 0, 200.0), verdict)
    assert report["ok"] is True and report["failures"] == []
    assert report["kills_by_point"] == {"cut": 2, "timeout:publish": 1, "training": 1}
    assert report["warnings"] == ["incarnation 3: publish not reached within 300s; killed anyway"]
    orjson.dumps(report)  # report.json must be plain JSON
    text = format_report(report, verdict)
    assert "kills by point: cut 2, timeout:publish 1, training 1" in text
    assert "restart -> first generation" in text and "restores: none" in text
    assert "INVARIANT BROKEN" not in text and text.endswith("chaos: PASS")


def test_crashes_and_a_failing_final_run_fail_the_chaos_run():
    rounds = _rounds() + [Round(5, "gym_prepare", "crashed", 1, 12.0, 0, "l5")]
    report = _report(rounds, Round(6, "none", "crashed", 1, 9.0, 0, "l6"), _verdict(ok=True))
    assert report["ok"] is False
    assert report["failures"] == [
        "incarnation 5 crashed with exit code 1 before its kill at gym_prepare (log l5)",
        "the final run exited with code 1 (log l6)",
    ]
    text = format_report(report, _verdict(ok=True))
    assert "RUN FAILED: incarnation 5 crashed" in text and text.endswith("chaos: FAIL")


def test_a_broken_invariant_fails_the_report():
    verdict = _verdict(ok=False)
    report = _report(_rounds(), Round(5, "none", "finished", 0, 200.0), verdict, problems=["after kill 1: x"])
    assert report["ok"] is False and report["failures"] == []
    assert report["newest_snapshot_problems"] == ["after kill 1: x"]
    assert any(line.startswith("INVARIANT BROKEN") for line in format_report(report, verdict).splitlines())


def test_a_run_that_finishes_early_is_a_warning():
    rounds = _rounds()[:2] + [Round(3, "cut", "finished", 0, 50.0)]
    report = _report(rounds, Round(4, "none", "finished", 0, 5.0), _verdict(ok=True))
    assert report["ok"] is True
    assert report["warnings"] == ["the run finished after 2 of 4 kills; give it more --steps"]


def _round(command, run_dir, point, target="all", max_delay_s=12.0, seed=0):
    incarnation = Incarnation(command, run_dir, 1, point)
    try:
        return one_round(incarnation, run_dir, target, point, 20, random.Random(seed), max_delay_s)
    finally:
        incarnation.close()


FAKE_RUN = """
import pathlib, sys, time
run_dir = pathlib.Path(sys.argv[1])
run_dir.mkdir(parents=True, exist_ok=True)
assert not any(run_dir.iterdir()), "a new run must find its directory empty"
(run_dir / "run.json").write_text("{}")
print("started", flush=True)
if sys.argv[2] == "crash":
    sys.exit(3)
time.sleep(0.3)
(run_dir / "chaos").mkdir(exist_ok=True)
(run_dir / "chaos" / "reached").write_text("cut")
time.sleep(60)
"""


def test_a_round_kills_the_run_at_its_point_and_keeps_its_log(tmp_path):
    run_dir = tmp_path / "run"
    record = _round([sys.executable, "-c", FAKE_RUN, str(run_dir), "wait"], run_dir, "cut")
    assert (record.outcome, record.exit_code, record.processes_killed) == ("killed", -9, 1)
    assert record.log == str(run_dir / "chaos" / "incarnation-1.log")
    assert (run_dir / "chaos" / "incarnation-1.log").read_text().startswith("started")
    assert not list(tmp_path.glob(".*.log"))


TRAINING_RUN = """
import pathlib, sys, time
run_dir = pathlib.Path(sys.argv[1])
run_dir.mkdir(parents=True, exist_ok=True)
(run_dir / "run.json").write_text("{}")
time.sleep(0.3)
(run_dir / "metrics.jsonl").write_text('{"kind": "train_step", "step": 1}\\n')
print("stepped", time.monotonic(), flush=True)
time.sleep(60)
"""


def test_a_random_moment_falls_inside_its_window_after_a_train_step(tmp_path):
    for seed, max_delay_s in ((1, 1.5), (2, 2.5)):
        run_dir = tmp_path / f"run{seed}"
        record = _round([sys.executable, "-c", TRAINING_RUN, str(run_dir)], run_dir, "random",
                        max_delay_s=max_delay_s, seed=seed)
        assert record.outcome == "killed"
        # From the start: 0.3 s to the step, then 0.5 s to max_delay_s, plus the start and the polls.
        assert 0.8 <= record.seconds <= 0.3 + max_delay_s + 2.0, record


def test_a_round_whose_run_crashes_records_the_exit_code(tmp_path):
    run_dir = tmp_path / "run"
    record = _round([sys.executable, "-c", FAKE_RUN, str(run_dir), "crash"], run_dir, "cut")
    assert (record.outcome, record.exit_code, record.processes_killed) == ("crashed", 3, 0)
    assert "AssertionError" not in (run_dir / "chaos" / "incarnation-1.log").read_text()


def test_a_run_that_dies_before_claiming_its_directory_leaves_it_startable(tmp_path):
    run_dir = tmp_path / "run"
    record = _round([sys.executable, "-c", "print('no'); raise SystemExit(2)"], run_dir, "cut")
    assert (record.outcome, record.exit_code) == ("crashed", 2)
    assert not run_dir.exists() or not any(run_dir.iterdir())
    assert (tmp_path / ".run.chaos-incarnation-1.log").read_text() == "no\n"


# A run with one helper process under a pid file. `repair`: it starts the helper again and trains on;
# `stop`: it stops with the one-line reason; `ignore`: it does neither.
FAKE_SUPERVISED_RUN = """
import json, pathlib, subprocess, sys, time
sys.path.insert(0, sys.argv[3])
from turnkeep.primitives.pid_files import write_pid_file
run_dir, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
run_dir.mkdir(parents=True, exist_ok=True)
(run_dir / "run.json").write_text("{}")
metrics = run_dir / "metrics.jsonl"
def step():
    with open(metrics, "a") as out:
        out.write(json.dumps({"kind": "train_step"}) + "\\n")
def helper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    write_pid_file(run_dir, "env", child.pid)
    return child
child = helper()
step()
while True:
    time.sleep(0.1)
    if child.poll() is not None:
        if mode == "stop":
            print("turnkeep: the run was stopped: the env process died; run the same command again", flush=True)
            sys.exit(1)
        if mode == "repair":
            child = helper()
            step()
"""


def _supervised(tmp_path, mode):
    run_dir = tmp_path / "run"
    root = str(pathlib.Path(__file__).resolve().parents[2])
    # The kill moment is not what these test: a short random window keeps them quick.
    return _round([sys.executable, "-c", FAKE_SUPERVISED_RUN, str(run_dir), mode, root], run_dir, "random", "env",
                  max_delay_s=1.0)


def test_a_process_killed_alone_that_the_run_starts_again_is_repaired(tmp_path):
    record = _supervised(tmp_path, "repair")
    assert (record.outcome, record.target, record.processes_killed) == ("repaired", "env", 1)
    assert record.after_kill_s is not None and record.after_kill_s < 10


def test_a_run_that_stops_after_a_kill_gives_its_one_line_reason(tmp_path):
    record = _supervised(tmp_path, "stop")
    assert (record.outcome, record.exit_code) == ("stopped", 1)
    assert record.reason.startswith("turnkeep: the run was stopped: the env process died")


def test_a_run_that_neither_repairs_nor_stops_fails_the_chaos_run(tmp_path, monkeypatch):
    monkeypatch.setattr("turnkeep.chaos.incarnation.AFTER_KILL_TIMEOUT_S", 2.0)
    record = _supervised(tmp_path, "ignore")
    assert record.outcome == "hung" and record.exit_code == -9
    report = _report([record], Round(2, "none", "finished", 0, 5.0), _verdict(ok=True))
    assert not report["ok"] and "neither stopped nor repaired" in report["failures"][0]


def test_targets_and_moments_are_mixed_over_a_schedule():
    every = parse_targets("every")
    schedule = kill_schedule(every, ["random", "cut"], 4 * len(every), random.Random(1))
    assert Counter(target for target, _ in schedule) == {t: 4 for t in every}
    assert "freeze-engine" in every
    assert {moment for _, moment in schedule} == {"random", "cut"}
    with pytest.raises(ValueError, match="choose from all, controller"):
        parse_targets("trainer,gpu")


def test_the_model_is_made_before_the_first_incarnation_and_a_failure_starts_nothing(tmp_path, capsys):
    """A first start that makes a big tiny model would outlast the phase timeout in every incarnation."""
    run_dir = tmp_path / "run"
    demonstrations = 'model.tiny.demonstrations="nowhere.module:Gone"'  # a config that loads; its model cannot be made
    assert run_chaos(parse(["--run-dir", str(run_dir), "--set", demonstrations])) == 2
    err = capsys.readouterr().err
    assert err.startswith("turnkeep chaos: the model could not be made (`turnkeep make-model` exit 2: ") and \
        "No module named 'nowhere'" in err and err.rstrip().endswith("nothing was started"), err
    assert len(err.strip().splitlines()) == 1
    assert not run_dir.exists()
