"""A run directory starts a new run, resumes one, or is refused untouched."""

from __future__ import annotations

import os

import orjson
import pytest

from turnkeep.controller.fingerprint import fingerprint_fields
from turnkeep.controller.restore.run_identity import RunDirError, open_run_dir
from turnkeep.controller.restore.unusable import UnusableRunDir
from turnkeep.controller.stores.trainer_checkpoint import CheckpointIdentity, write_checkpoint_manifest
from turnkeep.schemas.config import TurnkeepConfig


def config(run_dir, **task) -> TurnkeepConfig:
    return TurnkeepConfig.model_validate({"run": {"run_dir": str(run_dir)}, "task": task})


def snapshot_of(directory) -> dict:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_a_new_run_then_each_restart_is_the_next_incarnation(tmp_path) -> None:
    cfg = config(tmp_path / "run")
    first = open_run_dir(cfg)
    assert (first.incarnation, first.resumed) == (1, False)
    second = open_run_dir(cfg)
    third = open_run_dir(cfg)
    assert (second.run_id, second.incarnation, second.resumed) == (first.run_id, 2, True)
    assert third.incarnation == 3
    assert orjson.loads((tmp_path / "run" / "run.json").read_bytes()) == {"run_id": first.run_id, "incarnation": 3}
    assert (tmp_path / "run" / "config.3.json").exists()


def test_a_non_empty_directory_without_a_run_is_refused_untouched(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    before = snapshot_of(run_dir)
    with pytest.raises(RunDirError, match="holds no turnkeep run"):
        open_run_dir(config(run_dir))
    assert snapshot_of(run_dir) == before


def test_a_damaged_run_file_is_refused_untouched(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{not json")
    with pytest.raises(RunDirError, match="damaged"):
        open_run_dir(config(run_dir))
    assert (run_dir / "run.json").read_text() == "{not json"


def test_a_settings_change_no_checkpoint_fits_is_refused_before_anything_is_written(tmp_path) -> None:
    cfg = config(tmp_path / "run", num_operands=3)
    identity = open_run_dir(cfg)
    step_dir = tmp_path / "run" / "checkpoints" / "step_20"
    (step_dir / "trainer").mkdir(parents=True)
    (step_dir / "trainer" / "trainer_state.json").write_text('{"policy_version": 20}')
    write_checkpoint_manifest(step_dir, 20, CheckpointIdentity(identity.run_id, fingerprint_fields(cfg)))
    before = snapshot_of(tmp_path / "run")

    with pytest.raises(UnusableRunDir) as info:
        open_run_dir(config(tmp_path / "run", num_operands=4))
    message = str(info.value)
    assert "task.num_operands: saved 3, now 4" in message
    assert "config.json" in message and "--run-dir" in message
    assert snapshot_of(tmp_path / "run") == before  # the incarnation did not move
    assert open_run_dir(cfg).incarnation == 2  # the saved settings still resume


@pytest.fixture
def restored_umask():
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


def test_the_run_directory_and_what_the_run_writes_are_private(tmp_path, restored_umask) -> None:
    run_dir = tmp_path / "run"
    open_run_dir(config(run_dir))
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert (run_dir / "run.json").stat().st_mode & 0o777 == 0o600
    (run_dir / "later.log").write_text("a child process writes")  # what the run's processes create
    assert (run_dir / "later.log").stat().st_mode & 0o077 == 0
    run_dir.chmod(0o755)  # a directory made open by hand (or by an older turnkeep) is closed on restart
    open_run_dir(config(run_dir))
    assert run_dir.stat().st_mode & 0o777 == 0o700
