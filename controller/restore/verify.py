"""Checks of one candidate for a restore: a trainer checkpoint or a published snapshot, every file against its
manifest's digest, the run id, the settings and the policy version. A failed check is a SkippedCandidate with a
stable problem name and a detail naming the file or setting; reading never raises on a corrupt file."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from pydantic import ValidationError

from turnkeep.controller.journal.replay import resolve_state
from turnkeep.controller.restore.unusable import UNREADABLE, trainer_fingerprint_detail
from turnkeep.controller.stores.trainer_checkpoint import CHECKPOINT_MANIFEST, REQUIRED_FILES, SNAPSHOTS, STEP_DIR
from turnkeep.primitives import snapshot_paths
from turnkeep.primitives.atomic_files import sha256_file
from turnkeep.primitives.segment_format import JournalCorrupt
from turnkeep.schemas.participant import Artifact
from turnkeep.schemas.recovery import SkippedCandidate, SkipProblem, TrainerCheckpointManifest
from turnkeep.schemas.snapshot import SnapshotManifest

SNAPSHOT_CONTROLLER_STATE = "controller/state.json"
AGENTS_FILE = re.compile(r"^[^/]+/agents\.jsonl$")


class _Skip(Exception):
    """One failed check; turned into a SkippedCandidate at the verify boundary."""

    def __init__(self, problem: SkipProblem, detail: str) -> None:
        super().__init__(detail)
        self.problem = problem
        self.detail = detail


def verify_trainer_checkpoint(
    checkpoint_dir: Path, run_id: str, fingerprint: str, fingerprint_fields: dict | None = None
) -> tuple[TrainerCheckpointManifest | None, SkippedCandidate | None]:
    """Given the current `fingerprint_fields`, a changed-settings refusal names each setting."""
    try:
        manifest = _read_trainer_manifest(checkpoint_dir)
        _check_run(manifest.run_id, run_id, checkpoint_dir / CHECKPOINT_MANIFEST)
        if manifest.config_fingerprint != fingerprint:
            raise _Skip("fingerprint_differs", trainer_fingerprint_detail(checkpoint_dir, manifest, fingerprint,
                                                                           fingerprint_fields))
        _check_file_set(checkpoint_dir, manifest.artifacts)
        _check_artifacts(checkpoint_dir, manifest.artifacts)
    except _Skip as skip:
        return None, SkippedCandidate(path=str(checkpoint_dir), problem=skip.problem, detail=skip.detail)
    return manifest, None


def _check_file_set(checkpoint_dir: Path, artifacts: list[Artifact]) -> None:
    """The manifest lists every file a checkpoint must hold, and every file the directory holds.

    Only listed files are verified, so a file left out of `checkpoint.json` would be loaded
    unchecked. `snapshots/` is not part of it: each snapshot is published later, under its
    own manifest.
    """
    manifest_path = checkpoint_dir / CHECKPOINT_MANIFEST
    listed = {artifact.path for artifact in artifacts}
    unlisted_required = [rel for rel in REQUIRED_FILES if rel not in listed]
    if unlisted_required:
        raise _Skip(
            "missing_file",
            f"{manifest_path} lists no {', '.join(unlisted_required)}: a trainer checkpoint must hold and list "
            f"{', '.join(REQUIRED_FILES)}",
        )
    try:
        unlisted = sorted(rel for rel in _checkpoint_files(checkpoint_dir) if rel not in listed)
    except OSError as err:
        raise _Skip("missing_file", f"{checkpoint_dir} cannot be listed: {err}") from None
    if unlisted:
        shown = ", ".join(unlisted[:5]) + (f" and {len(unlisted) - 5} more" if len(unlisted) > 5 else "")
        raise _Skip(
            "unlisted_file",
            f"{manifest_path} does not list {shown}, which {checkpoint_dir} holds: the manifest does not describe "
            "the checkpoint (written after it was published, or the manifest is incomplete), so the file could "
            "not be verified",
        )


def _checkpoint_files(checkpoint_dir: Path) -> list[str]:
    """Every entry but a directory under `checkpoint_dir` (links and special files too), as relative paths,
    leaving out the manifest itself and the `snapshots/` directory."""
    found: list[str] = []
    pending = [checkpoint_dir]
    while pending:
        directory = pending.pop()
        for entry in directory.iterdir():
            if directory == checkpoint_dir and entry.name == CHECKPOINT_MANIFEST:
                continue
            is_dir = entry.is_dir() and not entry.is_symlink()
            if is_dir and directory == checkpoint_dir and entry.name == SNAPSHOTS:
                continue
            if is_dir:
                pending.append(entry)
            else:
                found.append(entry.relative_to(checkpoint_dir).as_posix())
    return found


def verify_snapshot(
    snapshot_dir: Path, run_id: str, fingerprint: str, policy_version: int | None = None
) -> tuple[SnapshotManifest | None, SkippedCandidate | None]:
    try:
        manifest = _read_snapshot_manifest(snapshot_dir)
        manifest_path = snapshot_dir / snapshot_paths.MANIFEST
        _check_run(manifest.run_id, run_id, manifest_path)
        if manifest.config_fingerprint != fingerprint:
            # A snapshot manifest keeps only the digest, so the setting cannot be named here;
            # its trainer checkpoint's manifest can (and is checked first by choose_source).
            raise _Skip(
                "fingerprint_differs",
                f"{manifest_path} has config fingerprint {manifest.config_fingerprint}, the current settings give "
                f"{fingerprint}: it was written with different model, task or group settings",
            )
        _check_artifacts(snapshot_dir, manifest.artifacts)
        if SNAPSHOT_CONTROLLER_STATE not in {artifact.path for artifact in manifest.artifacts}:
            raise _Skip(
                "missing_file",
                f"{manifest_path} lists no {SNAPSHOT_CONTROLLER_STATE}: without the controller's state the "
                "snapshot cannot be restored",
            )
        if policy_version is not None and manifest.policy_version != policy_version:
            raise _Skip(
                "policy_version_mismatch",
                f"{manifest_path} says policy version {manifest.policy_version}, its trainer checkpoint "
                f"says {policy_version}",
            )
        _check_journal(snapshot_dir)
    except _Skip as skip:
        return None, SkippedCandidate(path=str(snapshot_dir), problem=skip.problem, detail=skip.detail)
    return manifest, None


def _check_journal(snapshot_dir: Path) -> None:
    """A snapshot's state names a journal position: replay it now (digests checked), so a snapshot whose journal
    is damaged or pruned is passed over for an older source instead of failing the restore."""
    path = snapshot_dir / SNAPSHOT_CONTROLLER_STATE
    try:
        raw = orjson.loads(path.read_bytes())
    except UNREADABLE as err:
        raise _Skip("unreadable_manifest", f"{path} is not valid JSON ({err})") from None
    if not isinstance(raw, dict) or "journal_ref" not in raw:
        return  # a full state, from before journals
    run_dir = snapshot_dir.absolute().parents[3]  # <run_dir>/checkpoints/step_N/snapshots/<n>
    try:
        resolve_state(run_dir, raw)
    except (JournalCorrupt, ValidationError, KeyError, TypeError, ValueError) as err:
        raise _Skip("journal_unreadable", f"{path} cannot be rebuilt from its journal: {err}") from None


def _read_trainer_manifest(checkpoint_dir: Path) -> TrainerCheckpointManifest:
    path = checkpoint_dir / CHECKPOINT_MANIFEST
    if not path.exists():
        raise _Skip(
            "unreadable_manifest",
            f"{path} is missing: the checkpoint was written by an older turnkeep (before checkpoint manifests) "
            "or is incomplete",
        )
    manifest = _read_model(path, TrainerCheckpointManifest)
    expected = _step_of(checkpoint_dir)
    if expected is not None and manifest.step != expected:
        raise _Skip("unreadable_manifest", f"{path} says step {manifest.step}, but its directory is step_{expected}")
    return manifest


def _read_snapshot_manifest(snapshot_dir: Path) -> SnapshotManifest:
    path = snapshot_dir / snapshot_paths.MANIFEST
    if not path.exists():
        raise _Skip("unreadable_manifest", f"{path} is missing: the snapshot was never published")
    manifest = _read_model(path, SnapshotManifest)
    if snapshot_dir.name.isdigit() and manifest.number != int(snapshot_dir.name):
        raise _Skip(
            "unreadable_manifest", f"{path} says snapshot number {manifest.number}, but its directory is {snapshot_dir.name}"
        )
    return manifest


def _read_model(path: Path, model):
    """Parse `path` as `model`, first only far enough to see a newer schema version, so a
    newer writer's extra fields are reported as a newer schema rather than as garbage."""
    try:
        raw = orjson.loads(path.read_bytes())
    except UNREADABLE as err:
        raise _Skip("unreadable_manifest", f"{path} is not valid JSON ({err}): it is torn or overwritten") from None
    if not isinstance(raw, dict):
        raise _Skip("unreadable_manifest", f"{path} holds a JSON {type(raw).__name__}, not a manifest object")
    known = model.model_fields["schema_version"].default
    version = raw.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > known:
        raise _Skip(
            "newer_schema",
            f"{path} was written by a newer turnkeep (schema {version}, this one reads up to {known}); upgrade turnkeep",
        )
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in err.errors()[:3])
        raise _Skip("unreadable_manifest", f"{path} is not a {model.__name__} ({problems})") from None


def _check_run(found_run: str, run_id: str, path: Path) -> None:
    if found_run != run_id:
        raise _Skip("foreign_run", f"{path} was written by run {found_run!r}, this run is {run_id!r}")


def _check_artifacts(directory: Path, artifacts: list[Artifact]) -> None:
    root = directory.resolve()
    for artifact in artifacts:
        path = directory / artifact.path
        try:
            # A manifest is input like any other: a path may not reach outside its directory.
            inside = path.resolve().is_relative_to(root)
        except (OSError, ValueError, RuntimeError):
            inside = False
        if not inside:
            raise _Skip("unreadable_manifest", f"artifact path {artifact.path!r} points outside {directory}")
        try:
            if not path.is_file():
                raise _Skip("missing_file", f"{path} is listed in the manifest but does not exist")
            size = path.stat().st_size
            if size != artifact.bytes:
                raise _Skip("truncated", f"{path} has {size} bytes, the manifest says {artifact.bytes}")
            digest = sha256_file(path)
        except OSError as err:
            raise _Skip("missing_file", f"{path} cannot be read: {err}") from None
        if digest != artifact.sha256:
            raise _Skip(
                "digest_mismatch", f"{path} has sha256 {digest[:16]}..., the manifest says {artifact.sha256[:16]}..."
            )


def _step_of(checkpoint_dir: Path) -> int | None:
    match = STEP_DIR.match(checkpoint_dir.name)
    return int(match.group(1)) if match else None
