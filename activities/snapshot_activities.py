"""The controller's own attempt phases: preflight, staging, the data-plane cut, publish,
and the record that puts every attempt into metrics.jsonl."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from temporalio import activity

from controller.state.continuations import read_saved_agents
from controller.state.cut_state import write_cut_state
from activities.errors import invariant_broken, trainer_moved
from activities.snapshot_context import SnapshotContext
from controller.stores import snapshot_store
from controller.stores.trainer_checkpoint import published_steps
from primitives.chaos_points import reached, reached_sync
from primitives.atomic_files import append_jsonl
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
    def __init__(self, ctx: SnapshotContext) -> None:
        self._ctx = ctx

    @activity.defn(name="snapshot.anchor")
    async def anchor(self, inp: AnchorQuery) -> AnchorResult:
        self._ctx.check(inp.incarnation)
        steps = published_steps(self._ctx.run_dir)
        return AnchorResult(
            current_step=self._ctx.controller.training.step, newest_checkpoint_step=steps[-1] if steps else None
        )

    @activity.defn(name="snapshot.request_checkpoint")
    async def request_checkpoint(self, inp: CheckpointRequest) -> CheckpointRequestResult:
        self._ctx.check(inp.incarnation)
        self._ctx.controller.training.request_checkpoint(str(inp.trigger))
        return CheckpointRequestResult(requested=True)

    @activity.defn(name="snapshot.preflight")
    async def preflight(self, inp: PreflightInput) -> PreflightResult:
        ctx = self._ctx
        ctx.check(inp.incarnation)
        step = ctx.controller.training.step
        steps = published_steps(ctx.run_dir)
        if not steps:
            return PreflightResult(skip_reason="no trainer checkpoint yet", current_step=step)
        if step != steps[-1] or inp.anchor_step != step:
            return PreflightResult(
                skip_reason=f"no trainer checkpoint for the current step {step} (newest is step_{steps[-1]})",
                current_step=step,
            )
        if ctx.last_published_marker == await self._marker():
            return PreflightResult(skip_reason="nothing changed since the last published snapshot", current_step=step)
        return PreflightResult(skip_reason=None, current_step=step)

    async def _marker(self) -> tuple:
        health = await self._ctx.controller.env_client.health()
        return self._ctx.progress_marker(int(health["turn_commits"]))

    @activity.defn(name="snapshot.open_staging")
    async def open_staging(self, inp: StagingInput) -> StagingResult:
        self._ctx.check(inp.incarnation)
        staging = snapshot_store.open_staging(self._ctx.run_dir, inp.anchor_step, inp.number)
        return StagingResult(staging_dir=str(staging))

    @activity.defn(name="snapshot.discard_staging")
    async def discard_staging(self, inp: DiscardStagingInput) -> None:
        # Also for an earlier incarnation: a staging directory is never read, removing it is always safe.
        if not self._ctx.is_stale(inp.incarnation):
            self._ctx.check(inp.incarnation)
        if inp.staging_dir:
            shutil.rmtree(inp.staging_dir, ignore_errors=True)

    @activity.defn(name="data_plane.cut")
    async def cut(self, inp: CutInput) -> CutResult:
        ctx = self._ctx
        ctx.check(inp.incarnation)
        staging = Path(inp.staging_dir)
        saved_agents = read_saved_agents(staging)
        controller = ctx.controller
        async with controller.data_plane.barrier:
            step = controller.training.step
            if step != inp.expected_step and inp.expected_policy_version < 0:
                # Without the trainer hold (the peer's behaviour) this is expected: the attempt is wasted.
                raise trainer_moved(inp.expected_step, step)
            if step != inp.expected_step:
                raise invariant_broken(
                    f"the trainer step moved under the hold: cut sees {step}, the hold returned {inp.expected_step}"
                )
            path = staging / "controller" / "state.json"
            state = write_cut_state(controller, saved_agents, path)
            continuations = state["continuations"]
            ctx.cut_times[inp.checkpoint_id] = state["cut_unix_s"]
            if controller.audit is not None:
                controller.audit.flush()  # every row the cut saves is in the audit log first
            await reached("cut", ctx.run_dir)
            # Counts as "published" only once publish succeeds; a failed attempt must not cause a skip.
            ctx.cut_markers[inp.checkpoint_id] = await self._marker()
        return CutResult(
            artifacts=[snapshot_store.artifact_for(staging, path)],
            data_plane_rows=len(state["data_plane"]["rows"]),
            unfinished_groups=len(state["group_ledger"]["groups"]),
            continuations=len(continuations),
        )

    @activity.defn(name="snapshot.publish")
    async def publish(self, inp: PublishInput) -> PublishResult:
        ctx = self._ctx
        ctx.check(inp.incarnation)
        manifest = snapshot_store.new_manifest(
            run_id=inp.run_id, checkpoint_id=inp.checkpoint_id, anchor_step=inp.anchor_step, number=inp.number,
            policy_version=inp.policy_version, config_fingerprint=ctx.fingerprint, artifacts=inp.artifacts,
            counts=inp.counts,
        )
        final, size, pruned = snapshot_store.publish(
            Path(inp.staging_dir), manifest, inp.keep_latest_k, before_rename=lambda: reached_sync("publish", ctx.run_dir)
        )
        ctx.last_published_marker = ctx.cut_markers.pop(inp.checkpoint_id, ctx.last_published_marker)
        ctx.controller.audit_snapshot(inp.checkpoint_id, inp.anchor_step, str(final),
                                      ctx.cut_times.pop(inp.checkpoint_id, time.time()))
        log.info("snapshot published: %s (%d bytes)", final, size)
        return PublishResult(snapshot_dir=str(final), bytes_written=size, pruned=pruned)

    @activity.defn(name="snapshot.record")
    async def record(self, inp: AttemptRecord) -> RecordResult:
        ctx = self._ctx
        result = inp.result
        warning = None
        if result.admission_closed_s > ctx.interval_s and not ctx.warned_long_closure:
            ctx.warned_long_closure = True
            warning = (
                f"snapshot {result.checkpoint_id} kept new rollouts stopped for {result.admission_closed_s:.1f}s, "
                f"longer than snapshot.attempt_interval_s = {ctx.interval_s:g}s: snapshots pause generation for a "
                "large share of the run. Raise snapshot.attempt_interval_s (or speed up the slow participant)."
            )
            log.warning(warning)
        line = {"kind": "snapshot", **result.model_dump(mode="json"), "consecutive_failures": inp.consecutive_failures}
        if warning:
            line["warning"] = warning
        append_jsonl(ctx.run_dir / "metrics.jsonl", line, durable=False)
        ctx.controller.metrics.snapshot(result)
        ctx.recorded.append(result)
        ctx.recorded_changed.set()
        return RecordResult(warning=warning)
