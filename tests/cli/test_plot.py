"""`turnkeep plot`: the series it draws from a run directory (two incarnations, a kill, a restore, snapshot
attempts with admission closed), a PNG that opens at the expected size, and one line for a directory without a
run."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from PIL import Image

from turnkeep.cli.main import main
from turnkeep.cli.plot import build_figure
from turnkeep.cli.plot_data import gather_plot_data
from turnkeep.primitives.atomic_files import atomic_write_json
from turnkeep.schemas.audit import Restored, RunStarted, StepTrained

T0 = 1_800_000_000.0


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    atomic_write_json(run_dir / "run.json", {"run_id": "r", "incarnation": 2})
    events = [RunStarted(t=T0, inc=1, run_id="r", pid=10, resumed=False)]
    events += [StepTrained(t=T0 + 10 * s, inc=1, step=s, policy_version=s, group_ids=[]) for s in range(1, 7)]
    events.append(Restored(t=T0 + 120, inc=2, source="snapshot", step=4, policy_version=4, snapshot_dir="x",
                           checkpoint_dir="c", reason="newest", skipped=[], cut_unix_s=T0 + 41, rows=[],
                           continuations=[], unfinished_groups=[], next_group_index=0))
    events += [StepTrained(t=T0 + 120 + 10 * (s - 4), inc=2, step=s, policy_version=s, group_ids=[])
               for s in range(5, 9)]
    (run_dir / "audit.jsonl").write_bytes(b"".join(orjson.dumps(e.model_dump(mode="json")) + b"\n" for e in events))
    lines = [{"kind": "train_step", "step": s, "reward_mean": s / 10, "rollout_tokens_per_s": 100.0 + s}
             for s in range(1, 7)]  # older lines: their time comes from step_trained
    lines += [{"kind": "snapshot", "t": T0 + 45, "checkpoint_id": "r.snapshot.4.1", "outcome": "published",
               "wall_s": 2.0, "admission_closed_s": 0.5, "trainer_wait_s": 0.2,
               "phase_s": {"preflight": 0.1, "trainer_hold": 0.1}},
              {"kind": "recovery", "incarnation": 2, "source": {"kind": "snapshot", "step": 4}}]
    lines += [{"kind": "train_step", "t": T0 + 120 + 10 * (s - 4), "step": s, "reward_mean": s / 10,
               "rollout_tokens_per_s": 200.0} for s in range(5, 9)]
    lines += [{"kind": "env_restart", "t": T0 + 135, "restarts": 1, "url": "u", "seconds": 2.5},
              {"kind": "temporal_restart", "unix_s": T0 + 145, "restarts": 1, "seconds": 0.7}]
    lines += [{"kind": "snapshot", "t": T0 + 160, "checkpoint_id": "r.snapshot.8.1", "outcome": "failed",
               "wall_s": 4.0, "admission_closed_s": 0.0, "trainer_wait_s": 0.0, "phase_s": {}}]
    (run_dir / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines) + b'{"kind": "tr')
    return run_dir


def test_the_plot_data_has_every_step_attempt_restore_and_kill_on_one_clock(tmp_path):
    data = gather_plot_data(_run_dir(tmp_path))
    assert [(t - T0, step) for t, step, *_ in data.steps] == [
        (10.0, 1), (20.0, 2), (30.0, 3), (40.0, 4), (50.0, 5), (60.0, 6), (130.0, 5), (140.0, 6), (150.0, 7),
        (160.0, 8)]
    first = data.attempts[0]
    assert (first["start"] - T0, first["end"] - T0) == pytest.approx((43.0, 45.0))
    assert (first["admission"][0] - T0, first["admission"][1] - T0) == pytest.approx((43.2, 43.7))
    assert data.attempts[1]["outcome"] == "failed" and data.attempts[1]["admission"] is None
    assert data.restores == [(T0 + 120, "snapshot", 4)]
    assert data.deaths == [(T0 + 60, 1)]  # incarnation 1 ended without run_ended: it died after its last step
    assert data.restarts == [(T0 + 135, "env"), (T0 + 145, "temporal")]  # repaired by the run: no line break


def test_the_figure_draws_two_series_split_at_the_kill_with_spans_and_marks(tmp_path):
    figure = build_figure(gather_plot_data(_run_dir(tmp_path)))
    reward_ax, speed_ax = figure.axes
    # Each series is drawn in two pieces: a line never joins the dead incarnation to the restored one.
    assert [len(line.get_xdata()) for line in reward_ax.get_lines() if line.get_color() == "tab:blue"] == [6, 4]
    assert [len(line.get_xdata()) for line in speed_ax.get_lines() if line.get_color() == "tab:purple"] == [6, 4]
    labels = {text.get_text() for text in reward_ax.get_legend().get_texts()}
    assert labels == {"reward (mean)", "snapshot attempt", "admission closed", "trainer waited on the hold",
                      "restore (colour: source)", "process died / killed",
                      "env / Temporal server restarted by the run"}
    assert len(reward_ax.patches) == 3  # two attempt spans and one admission-closed span


def test_an_attempt_that_ended_at_once_is_drawn_as_a_line(tmp_path):
    run_dir = _run_dir(tmp_path)
    line = {"kind": "snapshot", "t": T0 + 150, "checkpoint_id": "r.snapshot.7.1", "outcome": "aborted",
            "wall_s": 0.0, "admission_closed_s": 0.0, "trainer_wait_s": 0.0, "phase_s": {}}
    whole = (run_dir / "metrics.jsonl").read_bytes().rsplit(b"\n", 1)[0] + b"\n"  # without the torn tail
    (run_dir / "metrics.jsonl").write_bytes(whole + orjson.dumps(line) + b"\n")
    data = gather_plot_data(run_dir)
    figure = build_figure(data)
    reward_ax, _ = figure.axes
    origin = min(t for t, *_ in data.steps)
    at = (T0 + 150 - origin) / 60.0
    marks = [mark for mark in reward_ax.get_lines()
             if mark.get_color() == "tab:red" and list(mark.get_xdata()) == pytest.approx([at, at])]
    assert len(marks) == 1
    assert len(reward_ax.patches) == 3  # the spans of the two longer attempts and the admission, as before


def test_the_command_writes_a_png_and_refuses_a_directory_without_a_run(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    assert main(["plot", str(run_dir)]) == 0
    with Image.open(run_dir / "plot.png") as image:
        assert image.format == "PNG" and image.size == (1320, 715)
    assert main(["plot", str(tmp_path / "nothing")]) == 2
    assert "is not a run directory (no run.json)" in capsys.readouterr().err


def test_a_damaged_audit_log_or_an_out_in_a_missing_folder_is_one_line(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "no" / "such" / "plot.png")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "the folder" in line and "no/such does not exist" in line
    audit = run_dir / "audit.jsonl"
    lines = audit.read_bytes().splitlines(keepends=True)
    audit.write_bytes(lines[0] + lines[1][:20] + b"\n" + b"".join(lines[2:]))  # a torn line in the middle
    assert main(["plot", str(run_dir)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"turnkeep: cannot plot {run_dir}: ") and "audit.jsonl line 2" in line, line
    assert not (run_dir / "plot.png").exists()
