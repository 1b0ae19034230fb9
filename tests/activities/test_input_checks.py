"""Anyone who can reach the Temporal frontend can schedule the controller's activities, so
each one that changes state checks its input first: a path outside where this run keeps
that kind of thing, a count out of range or an id of another attempt is refused with a
non-retryable error naming the field, the value and what is allowed, and nothing moves."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from temporalio.exceptions import ApplicationError

from turnkeep.activities.recovery_activities import RecoveryActivities
from turnkeep.activities.snapshot_activities import SnapshotActivities
from turnkeep.controller.snapshot.coordinator import SnapshotCoordinator
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.controller.stores import snapshot_store
from turnkeep.controller.stores.metrics import MetricsSink
from turnkeep.primitives import snapshot_paths
from turnkeep.schemas.attempt_steps import AttemptRecord, CutInput, DiscardStagingInput, PublishInput, StagingInput
from turnkeep.schemas.choices import Outcome, Trigger
from turnkeep.schemas.names import ErrorType, checkpoint_id
from turnkeep.schemas.participant import Artifact
from turnkeep.schemas.recovery import (
    RecoverySource,
    RecoveryStepInput,
    RestoreInput,
    RestoreResult,
    SkippedCandidate,
    SourceKind,
)
from turnkeep.schemas.snapshot import SnapshotAttemptResult

RUN = "run"
STEP = 4
ATTEMPT = checkpoint_id(RUN, STEP, 1)
SHA = "0" * 64


def _acts(run_dir: Path) -> tuple[SnapshotActivities, SnapshotCoordinator]:
    controller = SimpleNamespace(audit_snapshot=lambda *a: None, metrics=MetricsSink(run_dir, RunStats(), None))
    ctx = SnapshotCoordinator(run_id=RUN, incarnation=2, run_dir=run_dir, fingerprint="f", controller=controller,
                              trainer=None, environments=[], interval_s=5)
    return SnapshotActivities(ctx), ctx


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / f"step_{STEP}").mkdir(parents=True)
    return run_dir


def _refused(call, *fields: str) -> str:
    with pytest.raises(ApplicationError) as err:
        asyncio.run(call)
    message = err.value.message
    assert err.value.non_retryable and err.value.type == ErrorType.INVALID_INPUT, message
    assert "\n" not in message and message.startswith("refused ")
    for field in fields:
        assert field in message, message
    return message


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "precious.txt").write_text("keep me")
    return victim


# ---- snapshot.discard_staging ------------------------------------------------------------


def test_discard_staging_removes_only_its_own_staging_directory(tmp_path):
    run_dir = _run_dir(tmp_path)
    acts, _ = _acts(run_dir)
    victim = _victim(tmp_path)
    root = snapshot_paths.snapshots_root(run_dir, STEP)
    root.mkdir()
    link = root / ".staging-1-abcdef"
    os.symlink(victim, link)
    published = root / "1"
    published.mkdir()
    other_attempt = snapshot_store.open_staging(run_dir, STEP, 2)
    discard = lambda path, cid=ATTEMPT, inc=2: acts.discard_staging(  # noqa: E731
        DiscardStagingInput(checkpoint_id=cid, incarnation=inc, staging_dir=str(path)))

    message = _refused(discard(victim), "staging_dir", repr(str(victim)))
    assert ".staging-1-<hex>" in message
    _refused(discard(root / ".." / ".." / ".." / ".." / "victim"), "staging_dir")  # '..' resolved first
    _refused(discard(link), "staging_dir", "resolves to")  # a symlink out of the snapshot root
    _refused(discard(published), "staging_dir")  # a published snapshot is no staging directory
    _refused(discard(run_dir), "staging_dir")
    _refused(discard(other_attempt), "staging_dir")  # another attempt's
    _refused(discard(other_attempt, cid="other.snapshot.4.2"), "checkpoint_id")
    _refused(discard(other_attempt, cid=f"{RUN}.snapshot.4.2/../x"), "checkpoint_id")
    _refused(discard(other_attempt, cid=checkpoint_id(RUN, STEP, 2), inc=-1), "incarnation")
    assert (victim / "precious.txt").read_text() == "keep me" and published.is_dir() and other_attempt.is_dir()

    # Its own staging directory goes, also when an earlier incarnation asks (left open by a crash).
    asyncio.run(discard(other_attempt, cid=checkpoint_id(RUN, STEP, 2), inc=1))
    assert not other_attempt.exists() and (victim / "precious.txt").exists()


def test_a_snapshot_root_that_is_a_symlink_out_of_the_run_is_refused(tmp_path):
    run_dir = _run_dir(tmp_path)
    acts, _ = _acts(run_dir)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, snapshot_paths.snapshots_root(run_dir, STEP))
    staging = outside / ".staging-1-abcdef"
    staging.mkdir()
    _refused(acts.discard_staging(DiscardStagingInput(checkpoint_id=ATTEMPT, incarnation=2,
                                                      staging_dir=str(snapshot_paths.snapshots_root(run_dir, STEP) /
                                                                      staging.name))), "anchor_step")
    _refused(acts.open_staging(StagingInput(run_id=RUN, checkpoint_id=ATTEMPT, incarnation=2, anchor_step=STEP,
                                            number=1)), "anchor_step")
    assert staging.is_dir() and list(outside.iterdir()) == [staging]


# ---- snapshot.open_staging ---------------------------------------------------------------


def test_open_staging_refuses_ids_and_counts_of_another_attempt(tmp_path):
    run_dir = _run_dir(tmp_path)
    acts, _ = _acts(run_dir)
    open_ = lambda **kw: acts.open_staging(StagingInput(**{  # noqa: E731
        "run_id": RUN, "checkpoint_id": ATTEMPT, "incarnation": 2, "anchor_step": STEP, "number": 1, **kw}))
    _refused(open_(run_id="other"), "run_id", "'other'", repr(RUN))
    _refused(open_(number=2), "checkpoint_id", checkpoint_id(RUN, STEP, 2))
    _refused(open_(number=0, checkpoint_id=checkpoint_id(RUN, STEP, 0)), "number", ">= 1")
    _refused(open_(anchor_step=-1, checkpoint_id=checkpoint_id(RUN, -1, 1)), "anchor_step", ">= 0")
    assert not snapshot_paths.snapshots_root(run_dir, STEP).exists()
    staging = Path(asyncio.run(open_()).staging_dir)
    assert staging.parent == snapshot_paths.snapshots_root(run_dir, STEP).resolve() and staging.is_dir()


# ---- data_plane.cut ----------------------------------------------------------------------


def test_cut_refuses_a_staging_directory_elsewhere_before_it_writes(tmp_path):
    run_dir = _run_dir(tmp_path)
    acts, _ = _acts(run_dir)
    victim = _victim(tmp_path)
    cut = lambda **kw: acts.cut(CutInput(**{  # noqa: E731
        "run_id": RUN, "checkpoint_id": ATTEMPT, "incarnation": 2, "staging_dir": str(victim), "anchor_step": STEP,
        "hold": None, **kw}))
    _refused(cut(), "staging_dir")
    _refused(cut(checkpoint_id="run.snapshot.5.1"), "checkpoint_id", "anchor_step 4")
    _refused(cut(run_id="x"), "run_id")
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]


# ---- snapshot.publish --------------------------------------------------------------------


def _publish_input(staging: Path, **kw) -> PublishInput:
    return PublishInput(**{
        "run_id": RUN, "checkpoint_id": checkpoint_id(RUN, STEP, 9), "incarnation": 2, "staging_dir": str(staging),
        "anchor_step": STEP, "number": 9, "policy_version": 4,
        "artifacts": [Artifact(path="env/agents.jsonl", sha256=SHA, bytes=1)],
        "counts": {"parked_agents": 0}, "keep_latest_k": 2, **kw})


def test_publish_refuses_a_keep_count_below_one_and_nothing_moves(tmp_path):
    run_dir = _run_dir(tmp_path)
    acts, _ = _acts(run_dir)
    root = snapshot_paths.snapshots_root(run_dir, STEP)
    root.mkdir()
    for n in (7, 8):  # older published snapshots: a negative keep count would prune them
        (root / str(n)).mkdir()
        (root / str(n) / snapshot_paths.MANIFEST).write_text("{}")
    staging = snapshot_store.open_staging(run_dir, STEP, 9)
    (staging / "env").mkdir()
    (staging / "env" / "agents.jsonl").write_text("x")
    before = sorted(p.name for p in root.iterdir())

    for keep in (0, -1, -5):
        _refused(acts.publish(_publish_input(staging, keep_latest_k=keep)), "keep_latest_k", str(keep), ">= 1")
    _refused(acts.publish(_publish_input(staging, artifacts=[Artifact(path="../../x", sha256=SHA, bytes=1)])),
             "artifacts[0].path", "'../../x'")
    _refused(acts.publish(_publish_input(staging, artifacts=[Artifact(path="/etc/passwd", sha256=SHA, bytes=1)])),
             "artifacts[0].path")
    _refused(acts.publish(_publish_input(staging, artifacts=[Artifact(path="manifest.json", sha256=SHA, bytes=1)])),
             "artifacts[0].path")
    _refused(acts.publish(_publish_input(staging, counts={"rows": -1})), "counts['rows']")
    _refused(acts.publish(_publish_input(staging, policy_version=-1)), "policy_version")
    _refused(acts.publish(_publish_input(staging, number=2)), "checkpoint_id")
    _refused(acts.publish(_publish_input(staging, number=2, checkpoint_id=checkpoint_id(RUN, STEP, 2))), "staging_dir")
    _refused(acts.publish(_publish_input(tmp_path / "victim")), "staging_dir")
    assert sorted(p.name for p in root.iterdir()) == before
    assert not (staging / snapshot_paths.MANIFEST).exists()

    published = asyncio.run(acts.publish(_publish_input(staging, keep_latest_k=1)))
    assert Path(published.snapshot_dir).name == "9" and sorted(published.pruned) == ["7", "8"]


def test_the_store_refuses_a_keep_count_below_one_too(tmp_path):
    with pytest.raises(ValueError, match="keep_latest_k"):
        snapshot_store.prune(tmp_path, 0)
    with pytest.raises(ValueError, match="keep_latest_k"):
        snapshot_store.publish(tmp_path / ".staging-1-ab", None, -1)  # type: ignore[arg-type]


# ---- snapshot.record ---------------------------------------------------------------------


def test_record_refuses_another_runs_attempt_and_a_negative_count(tmp_path):
    acts, _ = _acts(tmp_path)
    result = SnapshotAttemptResult(checkpoint_id=ATTEMPT, outcome=Outcome.FAILED, reason="r", anchor_step=STEP,
                                   trigger=Trigger.PERIODIC)
    record = lambda res=result, n=0: acts.record(AttemptRecord(result=res, consecutive_failures=n))  # noqa: E731
    _refused(record(n=-1), "consecutive_failures")
    _refused(record(result.model_copy(update={"checkpoint_id": "other.snapshot.4.1"})), "result.checkpoint_id")
    _refused(record(result.model_copy(update={"anchor_step": 5})), "result.anchor_step")
    assert not (tmp_path / "metrics.jsonl").exists()
    asyncio.run(record())
    assert (tmp_path / "metrics.jsonl").exists()


# ---- recovery ----------------------------------------------------------------------------


class FakeRecovery:
    def __init__(self, run_dir: Path) -> None:
        self._cfg = SimpleNamespace(run=SimpleNamespace(run_dir=run_dir))
        self._identity = SimpleNamespace(run_id=RUN)
        self.restored: list[RecoverySource] = []

    async def restore(self, source: RecoverySource) -> RestoreResult:
        self.restored.append(source)
        return RestoreResult(step=source.step, policy_version=source.policy_version, data_plane_rows=0,
                             unfinished_groups=0, continuations=0, restarted_siblings=0)


class NoClient:
    def list_workflows(self, query: str):
        raise AssertionError(f"listed workflows for {query!r}")


def _snapshot_source(run_dir: Path, **kw) -> RecoverySource:
    checkpoint = run_dir / "checkpoints" / f"step_{STEP}"
    snapshot = checkpoint / "snapshots" / "3"
    return RecoverySource(**{
        "kind": SourceKind.SNAPSHOT, "step": STEP, "policy_version": STEP, "checkpoint_dir": str(checkpoint),
        "snapshot_dir": str(snapshot), "controller_state": str(snapshot / "controller" / "state.json"),
        "agents_files": [str(snapshot / "env" / "agents.jsonl")], "reason": "newest", **kw})


def test_restore_refuses_a_source_outside_the_checkpoint_root_and_restores_nothing(tmp_path):
    run_dir = _run_dir(tmp_path)
    recovery = FakeRecovery(run_dir)
    acts = RecoveryActivities(NoClient(), recovery, incarnation=2, wait_s=1)  # type: ignore[arg-type]
    elsewhere = tmp_path / "elsewhere" / "checkpoints" / f"step_{STEP}"
    elsewhere.mkdir(parents=True)
    os.symlink(elsewhere, run_dir / "checkpoints" / "step_9")
    restore = lambda source, run_id=RUN: acts.restore(  # noqa: E731
        RestoreInput(run_id=run_id, incarnation=2, source=source))
    good = _snapshot_source(run_dir)
    snapshot = Path(good.snapshot_dir)

    _refused(restore(good, run_id="other"), "run_id")
    _refused(restore(good.model_copy(update={"checkpoint_dir": str(elsewhere)})), "source.checkpoint_dir")
    _refused(restore(good.model_copy(update={"checkpoint_dir": str(run_dir / "checkpoints" / "step_9")})),
             "source.checkpoint_dir", "resolves to")
    _refused(restore(good.model_copy(update={"checkpoint_dir": str(run_dir / "checkpoints" / "step_3")})),
             "source.checkpoint_dir", "step_4")
    _refused(restore(good.model_copy(update={"snapshot_dir": str(run_dir)})), "source.snapshot_dir")
    _refused(restore(good.model_copy(update={"controller_state": "/etc/passwd"})), "source.controller_state")
    _refused(restore(good.model_copy(update={"agents_files": [str(snapshot / ".." / ".." / ".." / "x" /
                                                                  "agents.jsonl")]})), "source.agents_files[0]")
    _refused(restore(good.model_copy(update={"skipped": [SkippedCandidate(path=str(tmp_path / "victim"),
                                                                          problem="truncated", detail="d")]})),
             "source.skipped[0].path")
    _refused(restore(good.model_copy(update={"step": -1})), "source.step")
    _refused(restore(RecoverySource(kind=SourceKind.FRESH, step=0, policy_version=0, reason="r",
                                    checkpoint_dir=str(elsewhere))), "source.checkpoint_dir")
    _refused(restore(good.model_copy(update={"kind": SourceKind.TRAINER_CHECKPOINT})), "source.snapshot_dir")
    assert recovery.restored == []

    asyncio.run(restore(good))
    trainer_only = _snapshot_source(run_dir, kind=SourceKind.TRAINER_CHECKPOINT, snapshot_dir=None, agents_files=[],
                                    controller_state=str(run_dir / "checkpoints" / f"step_{STEP}" /
                                                         "controller_state.json"))
    asyncio.run(restore(trainer_only))
    asyncio.run(restore(RecoverySource(kind=SourceKind.FRESH, step=0, policy_version=0, reason="r")))
    assert len(recovery.restored) == 3


def test_cancel_stale_refuses_another_run_id_before_it_lists_any_workflow(tmp_path):
    acts = RecoveryActivities(NoClient(), FakeRecovery(tmp_path), incarnation=2, wait_s=1)  # type: ignore[arg-type]
    injected = f"{RUN}' OR TurnkeepRunId != '"
    message = _refused(acts.cancel_stale(RecoveryStepInput(run_id=injected, incarnation=2)), "run_id")
    assert repr(RUN) in message
    _refused(acts.resume(RecoveryStepInput(run_id="other", incarnation=2)), "run_id")


def test_a_source_that_choose_source_picked_passes_the_checks(tmp_path):
    """What `recovery.choose_source` returns, including the candidates it skipped, is never refused."""
    from tests.controller.restore.test_restore_source import FIELDS, RUN_ID, flip_byte, make_checkpoint, make_snapshot
    from turnkeep.activities.recovery_activities import check_source
    from turnkeep.controller.restore.restore_source import choose_source

    run_dir = tmp_path / "run"
    older = make_checkpoint(run_dir, 2)
    make_snapshot(older, 1)
    newest_snapshot = make_snapshot(older, 2)
    flip_byte(newest_snapshot / "env" / "agents.jsonl")
    flip_byte(make_checkpoint(run_dir, 4) / "trainer" / "shards" / "__0_0.distcp")
    source = choose_source(run_dir, RUN_ID, FIELDS)
    assert source.kind is SourceKind.OLDER_SNAPSHOT and len(source.skipped) == 2 and source.agents_files
    check_source(source, run_dir)
    fallback = choose_source(tmp_path / "other", RUN_ID, FIELDS)
    check_source(fallback, tmp_path / "other")
    (run_dir / "checkpoints" / "step_2" / "snapshots" / "1" / "env" / "agents.jsonl").unlink()
    trainer_only = choose_source(run_dir, RUN_ID, FIELDS)
    assert trainer_only.kind is SourceKind.TRAINER_CHECKPOINT
    check_source(trainer_only, run_dir)
