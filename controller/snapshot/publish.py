"""`snapshot.publish`: the manifest of an attempt, then the store's fsync, rename and prune."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from turnkeep.controller.stores import snapshot_store
from turnkeep.schemas.participant import Artifact


@dataclass(frozen=True)
class Published:
    snapshot_dir: Path
    bytes_written: int
    pruned: list[str]


def publish_snapshot(
    staging: Path, *, run_id: str, checkpoint_id: str, anchor_step: int, number: int, policy_version: int,
    fingerprint: str, artifacts: list[Artifact], counts: dict[str, int], keep_latest_k: int,
    before_rename: Callable[[], None] | None = None,
) -> Published:
    manifest = snapshot_store.new_manifest(
        run_id=run_id, checkpoint_id=checkpoint_id, anchor_step=anchor_step, number=number,
        policy_version=policy_version, config_fingerprint=fingerprint, artifacts=artifacts, counts=counts,
    )
    final, size, pruned = snapshot_store.publish(staging, manifest, keep_latest_k, before_rename=before_rename)
    return Published(snapshot_dir=final, bytes_written=size, pruned=pruned)
