"""`turnkeep status` from the files of a run that is down: what it shows, a torn last metrics line skipped,
and a directory that holds no run named in one line."""

from __future__ import annotations

from pathlib import Path

import orjson

from turnkeep.cli.main import main
from turnkeep.cli.status import render
from turnkeep.cli.status_files import gather
from turnkeep.controller.live_status import LIVE_STATUS_FILE
from turnkeep.primitives.atomic_files import atomic_write_json

NOW = 2_000_000_000.0


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "pids").mkdir(parents=True)
    atomic_write_json(run_dir / "run.json", {"run_id": "run-abc", "incarnation": 3})
    # A controller that is gone: the pid file names a pid whose start time does not match.
    atomic_write_json(run_dir / "pids" / "controller.json", {"role": "controller", "pid": 1, "create_time": 1.0})
    lines = [
        {"kind": "recovery", "incarnation": 3, "source": {"kind": "snapshot", "step": 8, "reason": "newest"}},
        {"kind": "train_step", "step": 11, "policy_version": 11, "reward_mean": 0.625,
         "rollout_tokens_per_s": 310.5, "train_step_s": 0.4, "staleness_max": 2},
        {"kind": "snapshot", "checkpoint_id": "run-abc.snapshot.12.1", "outcome": "published", "reason": "published",
         "anchor_step": 12, "trigger": "periodic", "parked_agents": 5, "data_plane_rows": 40,
         "admission_closed_s": 0.31, "wall_s": 0.9},
        {"kind": "train_step", "step": 12, "policy_version": 12, "reward_mean": 0.75,
         "rollout_tokens_per_s": 300.0, "train_step_s": 0.4, "staleness_max": 1},
    ]
    body = b"".join(orjson.dumps(line) + b"\n" for line in lines) + b'{"kind": "train_step", "step": 13, "rew'
    (run_dir / "metrics.jsonl").write_bytes(body)
    snapshot = run_dir / "checkpoints" / "step_12" / "snapshots" / "1"
    snapshot.mkdir(parents=True)
    (run_dir / "checkpoints" / "step_12" / "checkpoint.json").write_text("{}")
    atomic_write_json(snapshot / "manifest.json", {"anchor_step": 12, "policy_version": 12,
                                                   "created_unix_s": NOW - 90,
                                                   "counts": {"data_plane_rows": 40, "parked_agents": 5}})
    atomic_write_json(run_dir / LIVE_STATUS_FILE, {"t": NOW - 30, "incarnation": 3, "step": 12,
                                                   "holders": {"admission": ["snapshot:x"]}, "outstanding_groups": 4,
                                                   "rows_waiting": 8})
    return run_dir


def test_a_run_that_is_down_shows_its_last_step_snapshot_attempt_and_restore(tmp_path):
    report = gather(_run_dir(tmp_path), now=NOW)
    assert not report["up"] and report["processes"] == {"controller": None}
    assert report["training"]["step"] == 12 and report["training"]["reward_mean"] == 0.75  # torn line 13 skipped
    assert report["last_attempt"]["parked_agents"] == 5
    assert report["last_recovery"] == {"incarnation": 3, "source": "snapshot", "step": 8, "reason": "newest",
                                       "superseded": None}
    newest = report["newest_snapshot"]
    assert newest["dir"] == "checkpoints/step_12/snapshots/1" and newest["age_s"] == 90.0
    text = "\n".join(render(report))
    assert "run run-abc (incarnation 3)" in text and ": DOWN" in text
    assert "step 12 (policy version 12), reward 0.75, rollout 300 tok/s" in text
    assert "newest snapshot: checkpoints/step_12/snapshots/1, 90 s ago: step 12, 40 rows, 5 parked agents" in text
    assert "last restore (incarnation 3): from snapshot (step 8)" in text
    assert "gate holders" not in text  # a dead controller's holders are not shown as current
    assert "Temporal: the embedded dev server, stopped with the run" in text


def test_status_of_a_directory_without_a_run_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == f"turnkeep: {tmp_path} is not a run directory (no run.json); pass the --run-dir of a `turnkeep run`"


def test_status_json_is_one_object_with_every_section(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    assert main(["status", str(run_dir), "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert {"run_id", "up", "processes", "live", "training", "last_attempt", "last_recovery", "newest_snapshot",
            "temporal"} <= set(report)


def test_a_journal_snapshot_shows_the_running_agents_it_keeps_in_the_turn_journals(tmp_path):
    run_dir = _run_dir(tmp_path)
    manifest = run_dir / "checkpoints" / "step_12" / "snapshots" / "1" / "manifest.json"
    atomic_write_json(manifest, {"anchor_step": 12, "policy_version": 12, "created_unix_s": NOW - 90,
                                 "counts": {"data_plane_rows": 40, "journaled_agents": 17, "parked_agents": 0}})
    text = "\n".join(render(gather(run_dir, now=NOW)))
    assert "step 12, 40 rows, 17 running agents in the turn journals, 0 unfinished groups" in text
