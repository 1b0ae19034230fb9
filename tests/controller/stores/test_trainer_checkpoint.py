"""Trainer checkpoints: published whole, with a manifest recovery can verify, and pruned."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from controller.config_file import load_config
from controller.fingerprint import config_fingerprint, fingerprint_fields
from controller.restore.restore_source import verify_trainer_checkpoint
from controller.stores.trainer_checkpoint import (
    CheckpointIdentity,
    fingerprint_of,
    published_steps,
    write_trainer_checkpoint,
)
from primitives.atomic_files import atomic_write_json
from schemas.recovery import TrainerCheckpointManifest

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
    def __init__(self, policy_version: int, fail: bool = False) -> None:
        self.policy_version = policy_version
        self.fail = fail
        self.save_checkpoint = _Remote(self._save)

    def _save(self, directory: str) -> None:
        path = Path(directory)
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"w" * 64)
        (path / "optimizer.pt").write_bytes(b"adam")
        if self.fail:
            raise RuntimeError("disk full")
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
        "controller_state.json", "trainer/model.safetensors", "trainer/optimizer.pt", "trainer/trainer_state.json",
    ]
    assert verify_trainer_checkpoint(ckpt, "run-a", config_fingerprint(CFG)) == (manifest, None)
    assert orjson.loads((ckpt / "controller_state.json").read_bytes()) == {"step": 20}


def test_without_identity_no_manifest_is_written(tmp_path: Path) -> None:
    ckpt = write(tmp_path, 20, identity=None)
    assert (ckpt / "trainer" / "model.safetensors").exists()
    assert not (ckpt / "checkpoint.json").exists()


def test_a_failed_save_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="disk full"):
        write(tmp_path, 20, trainer=FakeTrainer(20, fail=True))
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_pruning_keeps_the_newest(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        write(tmp_path, step, keep=2)
    assert published_steps(tmp_path) == [30, 40]
    for step in (30, 40):
        assert verify_trainer_checkpoint(tmp_path / "checkpoints" / f"step_{step}", "run-a", config_fingerprint(CFG))[1] is None
