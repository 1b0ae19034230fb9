"""Trainer checkpoints: published whole, with a manifest recovery can verify, and pruned."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import orjson
import pytest

from turnkeep.config.loader import load_config
from turnkeep.controller.fingerprint import config_fingerprint, fingerprint_fields
from turnkeep.controller.restore.verify import verify_trainer_checkpoint
from turnkeep.controller.stores import trainer_checkpoint
from turnkeep.controller.stores.trainer_checkpoint import (
    CheckpointDiskFull,
    CheckpointIdentity,
    IncompleteCheckpoint,
    fingerprint_of,
    published_steps,
    write_trainer_checkpoint,
)
from turnkeep.primitives.atomic_files import atomic_write_json
from turnkeep.schemas.recovery import TrainerCheckpointManifest

CFG = load_config(Path(__file__).resolve().parents[3] / "configs" / "tiny.toml", {})
IDENTITY = CheckpointIdentity(run_id="run-a", fingerprint_fields=fingerprint_fields(CFG))


class _Remote:
    """Stands in for a Ray actor method: `.remote(...)` returns an awaitable."""

    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args):
        async def call():
            return self._fn(*args)

        return call()


class FakeTrainer:
    def __init__(self, policy_version: int, fail: BaseException | None = None, skip: str | None = None) -> None:
        self.policy_version = policy_version
        self.fail = fail
        self.skip = skip
        self.save_checkpoint = _Remote(self._save)

    def _save(self, directory: str) -> None:
        path = Path(directory)
        (path / "shards").mkdir(parents=True)
        (path / "shards" / ".metadata").write_bytes(b"dcp")
        (path / "shards" / "__0_0.distcp").write_bytes(b"w" * 64)
        if self.fail is not None:
            raise self.fail
        if self.skip != "rng":
            (path / "rng").mkdir()
            (path / "rng" / "rank_0.pt").write_bytes(b"rng")
        atomic_write_json(path / "trainer_state.json", {"policy_version": self.policy_version})


def write(run_dir: Path, step: int, *, keep: int = 3, identity=IDENTITY, trainer=None) -> Path:
    trainer = trainer or FakeTrainer(policy_version=step)
    return asyncio.run(write_trainer_checkpoint(run_dir, step, trainer, {"step": step}, keep, identity=identity))


def test_fingerprint_of_matches_the_config_fingerprint() -> None:
    assert fingerprint_of(fingerprint_fields(CFG)) == config_fingerprint(CFG)


def test_manifest_lists_every_file_and_verifies(tmp_path: Path) -> None:
    ckpt = write(tmp_path, 20)

    manifest = TrainerCheckpointManifest.model_validate_json((ckpt / "checkpoint.json").read_bytes())
    assert (manifest.run_id, manifest.step, manifest.policy_version) == ("run-a", 20, 20)
    assert manifest.config_fingerprint == config_fingerprint(CFG)
    assert sorted(a.path for a in manifest.artifacts) == [
        "controller_state.json", "trainer/rng/rank_0.pt", "trainer/shards/.metadata", "trainer/shards/__0_0.distcp",
        "trainer/trainer_state.json",
    ]
    assert verify_trainer_checkpoint(ckpt, "run-a", config_fingerprint(CFG)) == (manifest, None)
    assert orjson.loads((ckpt / "controller_state.json").read_bytes()) == {"step": 20}


def test_without_identity_no_manifest_is_written(tmp_path: Path) -> None:
    ckpt = write(tmp_path, 20, identity=None)
    assert (ckpt / "trainer" / "shards" / "__0_0.distcp").exists()
    assert not (ckpt / "checkpoint.json").exists()


def test_a_failed_save_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="trainer broke"):
        write(tmp_path, 20, trainer=FakeTrainer(20, fail=RuntimeError("trainer broke")))
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_pruning_keeps_the_newest(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        write(tmp_path, step, keep=2)
    assert published_steps(tmp_path) == [30, 40]
    for step in (30, 40):
        assert verify_trainer_checkpoint(tmp_path / "checkpoints" / f"step_{step}", "run-a", config_fingerprint(CFG))[1] is None


# ---- a full disk ----


def listing(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def verifies(run_dir: Path, step: int) -> bool:
    checkpoint_dir = run_dir / "checkpoints" / f"step_{step}"
    return verify_trainer_checkpoint(checkpoint_dir, "run-a", config_fingerprint(CFG))[1] is None


def test_a_full_disk_fails_cleanly_and_the_previous_checkpoint_stays(tmp_path: Path) -> None:
    write(tmp_path, 10, keep=2)
    write(tmp_path, 20, keep=2)
    enospc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "__0_0.distcp")

    with pytest.raises(CheckpointDiskFull) as info:
        write(tmp_path, 30, keep=2, trainer=FakeTrainer(30, fail=enospc))

    message = str(info.value)
    assert info.value.errno == errno.ENOSPC and info.value.__cause__ is enospc
    assert "step_30 could not be written" in message and "the disk is full" in message
    assert "bytes free" in message and "step_20 stays the newest trainer checkpoint" in message
    assert listing(tmp_path) == ["step_10", "step_20"]  # staging removed, nothing pruned
    assert verifies(tmp_path, 10) and verifies(tmp_path, 20)


def test_an_enospc_from_fsync_fails_the_same_way(tmp_path: Path, monkeypatch) -> None:
    write(tmp_path, 10, keep=1)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # the data never reached the disk

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(CheckpointDiskFull, match="step_10 stays the newest"):
        write(tmp_path, 20, keep=1)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert listing(tmp_path) == ["step_10"]
    assert verifies(tmp_path, 10)


def test_a_write_error_without_an_errno_on_a_nearly_full_disk_is_named(tmp_path: Path, monkeypatch) -> None:
    write(tmp_path, 10)
    real_statvfs = os.statvfs

    class Nearly:
        def __init__(self, path) -> None:
            stat = real_statvfs(path)
            self.f_frsize, self.f_bavail = stat.f_frsize, 3

    monkeypatch.setattr(os, "statvfs", Nearly)
    torch_says = RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file")
    with pytest.raises(CheckpointDiskFull, match="nearly full") as info:
        write(tmp_path, 20, trainer=FakeTrainer(20, fail=torch_says))
    assert info.value.__cause__ is torch_says
    assert listing(tmp_path) == ["step_10"]


def test_an_incomplete_trainer_checkpoint_is_never_published(tmp_path: Path) -> None:
    write(tmp_path, 10, keep=1)
    with pytest.raises(IncompleteCheckpoint, match="trainer/rng/rank_0.pt"):
        write(tmp_path, 20, keep=1, trainer=FakeTrainer(20, skip="rng"))
    assert listing(tmp_path) == ["step_10"]  # and not pruned for it


def test_a_failed_prune_does_not_fail_the_published_checkpoint(tmp_path: Path, monkeypatch, caplog) -> None:
    write(tmp_path, 10, keep=1)

    def no_room(path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(trainer_checkpoint, "retire_dir", no_room)
    with caplog.at_level(logging.WARNING, logger="turnkeep.checkpoint"):
        ckpt = write(tmp_path, 20, keep=1)
    assert ckpt.name == "step_20" and verifies(tmp_path, 20)
    assert listing(tmp_path) == ["step_10", "step_20"]
    assert any("could not prune" in r.getMessage() and "step_10" in r.getMessage() for r in caplog.records)
