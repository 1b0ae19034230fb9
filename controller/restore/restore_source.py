"""Where a restarted run continues from: the newest trainer checkpoint whose digests
verify, and under it the newest published snapshot that verifies too.

Every candidate that is passed over is reported with a stable problem name and a detail
that names the file or setting, so the operator can see what was lost and why. Reading
never raises on a corrupt file: a damaged candidate is skipped, not fatal, until there is
nothing left to fall back to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from turnkeep.controller.restore.unusable import UnusableRunDir, relative_to_run, saved_settings_diff, unusable_message
from turnkeep.controller.restore.verify import (
    AGENTS_FILE,
    SNAPSHOT_CONTROLLER_STATE,
    verify_snapshot,
    verify_trainer_checkpoint,
)
from turnkeep.controller.stores import snapshot_store
from turnkeep.controller.stores.trainer_checkpoint import (
    CONTROLLER_STATE,
    STEP_DIR,
    checkpoint_root,
    fingerprint_of,
    published_steps,
)
from turnkeep.schemas.recovery import RecoverySource, SkippedCandidate, SourceKind, TrainerCheckpointManifest


def choose_source(run_dir: Path, run_id: str, fingerprint_fields: dict) -> RecoverySource:
    run_dir = run_dir.absolute()
    fingerprint = fingerprint_of(fingerprint_fields)
    skipped: list[SkippedCandidate] = []
    # Only refusals for changed settings carry the saved fields; kept to name them.
    setting_diffs: dict[str, list[tuple[str, Any, Any]]] = {}
    steps = published_steps(run_dir)[::-1]
    if not steps:
        return RecoverySource(
            kind=SourceKind.FRESH, step=0, policy_version=0, reason="no trainer checkpoint yet: starting from step 0"
        )
    for step in steps:
        checkpoint_dir = checkpoint_root(run_dir) / f"step_{step}"
        manifest, skip = verify_trainer_checkpoint(checkpoint_dir, run_id, fingerprint, fingerprint_fields)
        if skip is not None:
            if skip.problem == "fingerprint_differs":
                setting_diffs[skip.path] = saved_settings_diff(checkpoint_dir, fingerprint_fields)
            skipped.append(skip)
            continue
        return _source_under(run_dir, checkpoint_dir, manifest, run_id, fingerprint, skipped)
    raise UnusableRunDir(unusable_message(run_dir, skipped, setting_diffs))


def newest_published_problem(run_dir: Path, run_id: str, fingerprint: str) -> SkippedCandidate | None:
    """The first problem of the newest trainer checkpoint or its newest published snapshot.

    A crash must never damage what was already published; this is what the chaos checker
    asks after every kill.
    """
    run_dir = run_dir.absolute()
    steps = published_steps(run_dir)
    if not steps:
        return None
    checkpoint_dir = checkpoint_root(run_dir) / f"step_{steps[-1]}"
    manifest, skip = verify_trainer_checkpoint(checkpoint_dir, run_id, fingerprint)
    if skip is not None:
        return skip
    numbers = snapshot_store.published(checkpoint_dir / "snapshots")
    if not numbers:
        return None
    _, skip = verify_snapshot(checkpoint_dir / "snapshots" / str(numbers[-1]), run_id, fingerprint, manifest.policy_version)
    return skip


def has_trainer_checkpoint(run_dir: Path) -> bool:
    """A published trainer checkpoint exists (not verified: `choose_source` does that)."""
    return bool(published_steps(run_dir))


def _source_under(
    run_dir: Path,
    checkpoint_dir: Path,
    checkpoint: TrainerCheckpointManifest,
    run_id: str,
    fingerprint: str,
    skipped: list[SkippedCandidate],
) -> RecoverySource:
    """The newest snapshot under a verified checkpoint, else the checkpoint's own state."""
    numbers = snapshot_store.published(checkpoint_dir / "snapshots")
    for number in reversed(numbers):
        snapshot_dir = checkpoint_dir / "snapshots" / str(number)
        snapshot, skip = verify_snapshot(snapshot_dir, run_id, fingerprint, checkpoint.policy_version)
        if skip is not None:
            skipped.append(skip)
            continue
        where = f"{relative_to_run(run_dir, snapshot_dir)} (step {checkpoint.step}, policy version {snapshot.policy_version})"
        if skipped:
            kind, reason = SourceKind.OLDER_SNAPSHOT, f"{_skipped_words(run_dir, skipped)}; using the older snapshot {where}"
        else:
            kind, reason = SourceKind.SNAPSHOT, f"newest snapshot {where}"
        snapshot_abs = snapshot_dir.absolute()
        return RecoverySource(
            kind=kind,
            step=checkpoint.step,
            policy_version=checkpoint.policy_version,
            checkpoint_dir=str(checkpoint_dir.absolute()),
            snapshot_dir=str(snapshot_abs),
            controller_state=str(snapshot_abs / SNAPSHOT_CONTROLLER_STATE),
            agents_files=sorted(str(snapshot_abs / a.path) for a in snapshot.artifacts if AGENTS_FILE.match(a.path)),
            reason=reason,
            skipped=skipped,
        )
    under = relative_to_run(run_dir, checkpoint_dir)
    none_left = f"no snapshot under {under} verified" if numbers else f"no published snapshot under {under}"
    fallback = (
        f"{none_left}; using the trainer checkpoint's own data plane (step {checkpoint.step}, "
        f"policy version {checkpoint.policy_version}): running agents continue from the environment servers' turn "
        "journals (those of a server without one start over)"
    )
    return RecoverySource(
        kind=SourceKind.TRAINER_CHECKPOINT,
        step=checkpoint.step,
        policy_version=checkpoint.policy_version,
        checkpoint_dir=str(checkpoint_dir.absolute()),
        controller_state=str(checkpoint_dir.absolute() / CONTROLLER_STATE),
        reason=f"{_skipped_words(run_dir, skipped)}; {fallback}" if skipped else fallback,
        skipped=skipped,
    )


def _skipped_words(run_dir: Path, skipped: list[SkippedCandidate]) -> str:
    return "; ".join(
        f"{_candidate_kind(skip)} {relative_to_run(run_dir, Path(skip.path))} failed verification ({skip.problem}: {skip.detail})"
        for skip in skipped
    )


def _candidate_kind(skip: SkippedCandidate) -> str:
    return "trainer checkpoint" if STEP_DIR.match(Path(skip.path).name) else "snapshot"


