"""The controller's own attempt phases: anchor, preflight, staging, the data-plane cut,
publish, and the record that puts every attempt into metrics.jsonl. Each calls the
snapshot coordinator or a store and translates its refusals for the workflow.

Every phase that changes state checks its input first (`activities.input_checks`).
"""

from __future__ import annotations

import logging
import shutil

from temporalio import activity

from turnkeep.activities.errors import check_incarnation, translated_errors
from turnkeep.activities.input_checks import (
    check_artifacts,
    check_attempt_id,
    check_int,
    check_run_id,
    check_snapshot_root,
    check_staging_dir,
    parse_attempt_id,
    refused,
)
from turnkeep.controller.snapshot.coordinator import SnapshotCoordinator
from turnkeep.controller.snapshot.cut import cut_data_plane
from turnkeep.controller.snapshot.publish import publish_snapshot
from turnkeep.controller.stores import snapshot_store
from turnkeep.primitives.chaos_points import reached, reached_sync
from turnkeep.schemas.attempt_steps import (
    ANCHOR,
    CUT,
    DISCARD_STAGING,
    OPEN_STAGING,
    PREFLIGHT,
    PUBLISH,
    RECORD,
    REQUEST_CHECKPOINT,
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
from turnkeep.schemas.choices import Trigger
from turnkeep.schemas.names import checkpoint_holder
from turnkeep.schemas.participant import JournalMark

log = logging.getLogger("turnkeep.snapshot")

class SnapshotActivities:
    def __init__(self, snapshots: SnapshotCoordinator) -> None:
        self._snapshots = snapshots

    def _check(self, incarnation: int) -> None:
        check_incarnation(incarnation, self._snapshots.incarnation)

    def _check_attempt(self, run_id: str, attempt_id: str, step: int, number: int | None = None) -> int:
        """This run's attempt `attempt_id`, filed under `step` (and numbered `number`); returns its number."""
        own = self._snapshots.run_id
        check_run_id("run_id", run_id, own)
        check_int("anchor_step", step, 0)
        if number is None:
            parsed_step, number = parse_attempt_id("checkpoint_id", attempt_id, own)
            if parsed_step != step:
                raise refused("checkpoint_id", attempt_id, f"an attempt id under anchor_step {step}")
        check_int("number", number, 1)
        check_attempt_id("checkpoint_id", attempt_id, own, step, number)
        return number

    @activity.defn(name=ANCHOR)
    async def anchor(self, inp: AnchorQuery) -> AnchorResult:
        self._check(inp.incarnation)
        training = self._snapshots.controller.training
        return AnchorResult(current_step=training.step, newest_checkpoint_step=training.checkpointed_step)

    @activity.defn(name=REQUEST_CHECKPOINT)
    async def request_checkpoint(self, inp: CheckpointRequest) -> CheckpointRequestResult:
        self._check(inp.incarnation)
        if inp.trigger not in set(Trigger):
            raise refused("trigger", inp.trigger, f"one of {', '.join(Trigger)}")
        self._snapshots.controller.training.request_checkpoint(str(inp.trigger))
        return CheckpointRequestResult()

    @activity.defn(name=PREFLIGHT)
    async def preflight(self, inp: PreflightInput) -> PreflightResult:
        self._check(inp.incarnation)
        return PreflightResult(skip_reason=await self._snapshots.skip_reason(inp.anchor_step))

    @activity.defn(name=OPEN_STAGING)
    async def open_staging(self, inp: StagingInput) -> StagingResult:
        self._check(inp.incarnation)
        self._check_attempt(inp.run_id, inp.checkpoint_id, inp.anchor_step, inp.number)
        check_snapshot_root("anchor_step", inp.anchor_step, self._snapshots.run_dir)
        staging = snapshot_store.open_staging(self._snapshots.run_dir, inp.anchor_step, inp.number)
        return StagingResult(staging_dir=str(staging))

    @activity.defn(name=DISCARD_STAGING)
    async def discard_staging(self, inp: DiscardStagingInput) -> None:
        snapshots = self._snapshots
        check_int("incarnation", inp.incarnation, 1)
        # Also for an earlier incarnation: a staging directory is never read, removing it is always safe.
        if not snapshots.is_stale(inp.incarnation):
            self._check(inp.incarnation)
        step, number = parse_attempt_id("checkpoint_id", inp.checkpoint_id, snapshots.run_id)
        if inp.staging_dir:
            staging = check_staging_dir("staging_dir", inp.staging_dir, snapshots.run_dir, step, number)
            shutil.rmtree(staging, ignore_errors=True)

    @activity.defn(name=CUT)
    async def cut(self, inp: CutInput) -> CutResult:
        snapshots = self._snapshots
        self._check(inp.incarnation)
        number = self._check_attempt(inp.run_id, inp.checkpoint_id, inp.anchor_step)
        staging = check_staging_dir("staging_dir", inp.staging_dir, snapshots.run_dir, inp.anchor_step, number)
        if inp.checkpoint_hold and (inp.hold is not None or inp.marks is None):
            raise refused("checkpoint_hold", inp.checkpoint_hold, "false unless a journal attempt (marks set) "
                                                                  "without a hold of its own (hold unset)")
        if inp.hold is not None and inp.hold.step != inp.anchor_step:
            raise refused("hold.step", inp.hold.step, f"the anchor step {inp.anchor_step} (an attempt whose hold "
                                                      "returned another step is skipped before its cut)")
        if inp.marks is not None:
            _check_marks(inp.marks, inp.checkpoint_id, [env.name for env in snapshots.environments])
        # The progress marker asks every environment server for its counters: over the network, so before
        # the barrier, never under it. Admission is closed and every agent parked by now, and each part of
        # the marker only grows (but the row count, which only a sealed row raises), so a marker taken a
        # moment early can make a later preflight take an attempt, never skip one that had something to save.
        marker = await snapshots.progress_marker()

        async def at_the_cut() -> None:
            await reached("cut", snapshots.run_dir)
            snapshots.cut_markers[inp.checkpoint_id] = marker

        with translated_errors():
            cut = await cut_data_plane(snapshots.controller, staging, inp.anchor_step, inp.hold, at_the_cut, inp.marks,
                                       inp.checkpoint_hold)
        snapshots.cut_times[inp.checkpoint_id] = cut.cut_unix_s
        released, waited_s = (await self._release_checkpoint_hold(inp.anchor_step) if inp.checkpoint_hold
                              else (False, 0.0))
        return CutResult(artifacts=[cut.artifact], policy_version=cut.policy_version,
                         running_agents=cut.running_agents, checkpoint_hold_released=released,
                         trainer_wait_s=waited_s, **cut.counts())

    async def _release_checkpoint_hold(self, anchor_step: int) -> tuple[bool, float]:
        """The train pump's hold after the anchor's checkpoint, which a journal attempt keeps instead of taking one
        of its own: the cut is what it guarded, so it goes now, through Ray as the pump took it. (released, seconds
        the optimizer step waited on it); (False, 0) when the trainer does not answer, and the workflow releases it
        on the trainer's queue instead: the cut stands either way."""
        holder = checkpoint_holder(anchor_step)
        try:
            released, waited_s = await self._snapshots.trainer.hold_release_timed.remote(holder)
        except Exception as err:  # noqa: BLE001 - a dead trainer fails the run elsewhere; the hold has a lease
            log.warning("the cut could not release %s through Ray (%s); the trainer's queue will", holder, err)
            return False, 0.0
        return bool(released), float(waited_s)

    @activity.defn(name=PUBLISH)
    async def publish(self, inp: PublishInput) -> PublishResult:
        snapshots = self._snapshots
        self._check(inp.incarnation)
        self._check_attempt(inp.run_id, inp.checkpoint_id, inp.anchor_step, inp.number)
        staging = check_staging_dir("staging_dir", inp.staging_dir, snapshots.run_dir, inp.anchor_step, inp.number)
        check_int("keep_latest_k", inp.keep_latest_k, 1)
        check_int("policy_version", inp.policy_version, 0)
        for name, count in inp.counts.items():
            check_int(f"counts[{name!r}]", count, 0)
        check_artifacts("artifacts", inp.artifacts, staging)
        published = publish_snapshot(
            staging, run_id=inp.run_id, checkpoint_id=inp.checkpoint_id, anchor_step=inp.anchor_step,
            number=inp.number, policy_version=inp.policy_version, fingerprint=snapshots.fingerprint,
            artifacts=inp.artifacts, counts=inp.counts, keep_latest_k=inp.keep_latest_k,
            before_rename=lambda: reached_sync("publish", snapshots.run_dir),
        )
        snapshots.note_published(inp.checkpoint_id, inp.anchor_step, published.snapshot_dir)
        log.info("snapshot published: %s (%d bytes)", published.snapshot_dir, published.bytes_written)
        return PublishResult(snapshot_dir=str(published.snapshot_dir), bytes_written=published.bytes_written,
                             pruned=published.pruned)

    @activity.defn(name=RECORD)
    async def record(self, inp: AttemptRecord) -> RecordResult:
        result = inp.result
        step, _ = parse_attempt_id("result.checkpoint_id", result.checkpoint_id, self._snapshots.run_id)
        if result.anchor_step != step:
            raise refused("result.anchor_step", result.anchor_step, f"{step}, the step in its checkpoint_id")
        check_int("consecutive_failures", inp.consecutive_failures, 0)
        return RecordResult(warning=self._snapshots.record(result, inp.consecutive_failures))


def _check_marks(marks: list[JournalMark], checkpoint_id: str, servers: list[str]) -> None:
    """A journal snapshot's marks: one per environment server, each made for this attempt."""
    names = sorted(mark.name for mark in marks)
    if names != sorted(servers):
        raise refused("marks", names, f"one mark per environment server ({', '.join(sorted(servers))})")
    for mark in marks:
        if mark.checkpoint_id != checkpoint_id:
            raise refused("marks", mark.checkpoint_id, f"marks made for this attempt, {checkpoint_id}")
