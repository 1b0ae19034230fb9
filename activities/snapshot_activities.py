"""The controller's own attempt phases: anchor, preflight, staging, the data-plane cut,
publish, and the record that puts every attempt into metrics.jsonl. Each calls the
snapshot coordinator or a store and translates its refusals for the workflow."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from temporalio import activity

from activities.errors import check_incarnation, translated_errors
from controller.snapshot.coordinator import SnapshotCoordinator
from controller.snapshot.cut import cut_data_plane
from controller.snapshot.publish import publish_snapshot
from controller.stores import snapshot_store
from primitives.chaos_points import reached, reached_sync
from schemas.names import Activity
from schemas.snapshot import (
    AnchorQuery,
    AnchorResult,
    AttemptRecord,
    CheckpointRequest,
    CheckpointRequestResult,
    CutInput,
    CutResult,
    DiscardStagingInput,
    PreflightInput,
    PreflightResult,
    PublishInput,
    PublishResult,
    RecordResult,
    StagingInput,
    StagingResult,
)

log = logging.getLogger("turnkeep.snapshot")


class SnapshotActivities:
    def __init__(self, snapshots: SnapshotCoordinator) -> None:
        self._snapshots = snapshots

    def _check(self, incarnation: int) -> None:
        check_incarnation(incarnation, self._snapshots.incarnation)

    @activity.defn(name=Activity.ANCHOR)
    async def anchor(self, inp: AnchorQuery) -> AnchorResult:
        self._check(inp.incarnation)
        training = self._snapshots.controller.training
        return AnchorResult(current_step=training.step, newest_checkpoint_step=training.checkpointed_step)

    @activity.defn(name=Activity.REQUEST_CHECKPOINT)
    async def request_checkpoint(self, inp: CheckpointRequest) -> CheckpointRequestResult:
        self._check(inp.incarnation)
        self._snapshots.controller.training.request_checkpoint(str(inp.trigger))
        return CheckpointRequestResult()

    @activity.defn(name=Activity.PREFLIGHT)
    async def preflight(self, inp: PreflightInput) -> PreflightResult:
        self._check(inp.incarnation)
        return PreflightResult(skip_reason=await self._snapshots.skip_reason(inp.anchor_step))

    @activity.defn(name=Activity.OPEN_STAGING)
    async def open_staging(self, inp: StagingInput) -> StagingResult:
        self._check(inp.incarnation)
        staging = snapshot_store.open_staging(self._snapshots.run_dir, inp.anchor_step, inp.number)
        return StagingResult(staging_dir=str(staging))

    @activity.defn(name=Activity.DISCARD_STAGING)
    async def discard_staging(self, inp: DiscardStagingInput) -> None:
        # Also for an earlier incarnation: a staging directory is never read, removing it is always safe.
        if not self._snapshots.is_stale(inp.incarnation):
            self._check(inp.incarnation)
        if inp.staging_dir:
            shutil.rmtree(inp.staging_dir, ignore_errors=True)

    @activity.defn(name=Activity.CUT)
    async def cut(self, inp: CutInput) -> CutResult:
        snapshots = self._snapshots
        self._check(inp.incarnation)
        staging = Path(inp.staging_dir)

        async def at_the_cut() -> None:
            await reached("cut", snapshots.run_dir)
            await snapshots.mark_cut(inp.checkpoint_id)

        with translated_errors():
            cut = await cut_data_plane(snapshots.controller, staging, inp.anchor_step, inp.hold, at_the_cut)
        snapshots.cut_times[inp.checkpoint_id] = cut.cut_unix_s
        return CutResult(artifacts=[cut.artifact], policy_version=cut.policy_version, **cut.counts())

    @activity.defn(name=Activity.PUBLISH)
    async def publish(self, inp: PublishInput) -> PublishResult:
        snapshots = self._snapshots
        self._check(inp.incarnation)
        published = publish_snapshot(
            Path(inp.staging_dir), run_id=inp.run_id, checkpoint_id=inp.checkpoint_id, anchor_step=inp.anchor_step,
            number=inp.number, policy_version=inp.policy_version, fingerprint=snapshots.fingerprint,
            artifacts=inp.artifacts, counts=inp.counts, keep_latest_k=inp.keep_latest_k,
            before_rename=lambda: reached_sync("publish", snapshots.run_dir),
        )
        snapshots.note_published(inp.checkpoint_id, inp.anchor_step, published.snapshot_dir)
        log.info("snapshot published: %s (%d bytes)", published.snapshot_dir, published.bytes_written)
        return PublishResult(snapshot_dir=str(published.snapshot_dir), bytes_written=published.bytes_written,
                             pruned=published.pruned)

    @activity.defn(name=Activity.RECORD)
    async def record(self, inp: AttemptRecord) -> RecordResult:
        return RecordResult(warning=self._snapshots.record(inp.result, inp.consecutive_failures))
