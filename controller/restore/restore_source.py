"""Where a restarted run continues from: the newest trainer checkpoint whose digests
verify, and under it the newest published snapshot that verifies too.

Every candidate that is passed over is reported with a stable problem name and a detail
that names the file or setting, so the operator can see what was lost and why. Reading
never raises on a corrupt file: a damaged candidate is skipped, not fatal, until there is
nothing left to fall back to.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from controller.journal.replay import resolve_state
from controller.stores import snapshot_store
from controller.stores.trainer_checkpoint import (
    CHECKPOINT_MANIFEST,
    CONTROLLER_STATE,
    REQUIRED_FILES,
    SNAPSHOTS,
    STEP_DIR,
    checkpoint_root,
    fingerprint_of,
)
from primitives.atomic_files import sha256_file
from primitives.segment_format import JournalCorrupt
from schemas.participant import Artifact
from schemas.recovery import (
    RecoverySource,
    SkippedCandidate,
    SkipProblem,
    SourceKind,
    TrainerCheckpointManifest,
)
from schemas.snapshot import SnapshotManifest

SNAPSHOT_CONTROLLER_STATE = "controller/state.json"
AGENTS_FILE = re.compile(r"^[^/]+/agents\.jsonl$")
_UNREADABLE = (OSError, ValueError, ValidationError)


class UnusableRunDir(Exception):
    """No checkpoint in the run dir can be used; the message names the problem and the fix."""


class _Skip(Exception):
    """One failed check; turned into a SkippedCandidate at the verify boundary."""

    def __init__(self, problem: SkipProblem, detail: str) -> None:
        super().__init__(detail)
        self.problem = problem
        self.detail = detail


# ---- verification ----


def verify_trainer_checkpoint(
    checkpoint_dir: Path, run_id: str, fingerprint: str, fingerprint_fields: dict | None = None
) -> tuple[TrainerCheckpointManifest | None, SkippedCandidate | None]:
    """Given the current `fingerprint_fields`, a changed-settings refusal names each setting."""
    try:
        manifest = _read_trainer_manifest(checkpoint_dir)
        _check_run(manifest.run_id, run_id, checkpoint_dir / CHECKPOINT_MANIFEST)
        if manifest.config_fingerprint != fingerprint:
            raise _Skip("fingerprint_differs", _trainer_fingerprint_detail(checkpoint_dir, manifest, fingerprint,
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
        manifest_path = snapshot_dir / snapshot_store.MANIFEST
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
    except _UNREADABLE as err:
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
    path = snapshot_dir / snapshot_store.MANIFEST
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
    except _UNREADABLE as err:
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


def _trainer_fingerprint_detail(
    checkpoint_dir: Path, manifest: TrainerCheckpointManifest, fingerprint: str, current: dict | None
) -> str:
    detail = (
        f"{checkpoint_dir / CHECKPOINT_MANIFEST} has config fingerprint {manifest.config_fingerprint}, the current "
        f"settings give {fingerprint}"
    )
    diffs = _differing_settings(manifest.fingerprint_fields, current) if current is not None else []
    return f"{detail} ({_describe_settings(diffs)})" if diffs else detail


def _differing_settings(saved: Any, current: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted name, saved value, current value) for every leaf setting that differs."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out: list[tuple[str, Any, Any]] = []
        for key in sorted(set(saved) | set(current), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            out += _differing_settings(saved.get(key, _ABSENT), current.get(key, _ABSENT), name)
        return out
    return [] if saved == current else [(prefix, saved, current)]


class _Absent:
    def __repr__(self) -> str:
        return "(not set)"


_ABSENT = _Absent()


def _show(value: Any) -> str:
    if isinstance(value, _Absent):
        return repr(value)
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


def _describe_settings(diffs: list[tuple[str, Any, Any]]) -> str:
    return "; ".join(f"{name}: saved {_show(saved)}, now {_show(now)}" for name, saved, now in diffs)


# ---- choosing ----


def choose_source(run_dir: Path, run_id: str, fingerprint_fields: dict) -> RecoverySource:
    run_dir = run_dir.absolute()
    fingerprint = fingerprint_of(fingerprint_fields)
    skipped: list[SkippedCandidate] = []
    # Only refusals for changed settings carry the saved fields; kept to name them.
    setting_diffs: dict[str, list[tuple[str, Any, Any]]] = {}
    steps = _checkpoint_steps(run_dir)
    if not steps:
        return RecoverySource(
            kind=SourceKind.FRESH, step=0, policy_version=0, reason="no trainer checkpoint yet: starting from step 0"
        )
    for step in steps:
        checkpoint_dir = checkpoint_root(run_dir) / f"step_{step}"
        manifest, skip = verify_trainer_checkpoint(checkpoint_dir, run_id, fingerprint, fingerprint_fields)
        if skip is not None:
            if skip.problem == "fingerprint_differs":
                setting_diffs[skip.path] = _saved_settings_diff(checkpoint_dir, fingerprint_fields)
            skipped.append(skip)
            continue
        return _source_under(run_dir, checkpoint_dir, manifest, run_id, fingerprint, skipped)
    raise UnusableRunDir(_unusable_message(run_dir, skipped, setting_diffs))


def newest_published_problem(run_dir: Path, run_id: str, fingerprint: str) -> SkippedCandidate | None:
    """The first problem of the newest trainer checkpoint or its newest published snapshot.

    A crash must never damage what was already published; this is what the chaos checker
    asks after every kill.
    """
    run_dir = run_dir.absolute()
    steps = _checkpoint_steps(run_dir)
    if not steps:
        return None
    checkpoint_dir = checkpoint_root(run_dir) / f"step_{steps[0]}"
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
    return bool(_checkpoint_steps(run_dir))


def _checkpoint_steps(run_dir: Path) -> list[int]:
    """Published trainer checkpoint steps, newest first (staging dirs never match)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    steps = (int(m.group(1)) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir())
    return sorted(steps, reverse=True)


def _step_of(checkpoint_dir: Path) -> int | None:
    match = STEP_DIR.match(checkpoint_dir.name)
    return int(match.group(1)) if match else None


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
        where = f"{_rel(run_dir, snapshot_dir)} (step {checkpoint.step}, policy version {snapshot.policy_version})"
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
    under = _rel(run_dir, checkpoint_dir)
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
        f"{_candidate_kind(skip)} {_rel(run_dir, Path(skip.path))} failed verification ({skip.problem}: {skip.detail})"
        for skip in skipped
    )


def _candidate_kind(skip: SkippedCandidate) -> str:
    return "trainer checkpoint" if STEP_DIR.match(Path(skip.path).name) else "snapshot"


def _rel(run_dir: Path, path: Path) -> str:
    try:
        return str(path.relative_to(run_dir))
    except ValueError:
        return str(path)


def _saved_settings_diff(checkpoint_dir: Path, current: dict) -> list[tuple[str, Any, Any]]:
    try:
        saved = TrainerCheckpointManifest.model_validate_json((checkpoint_dir / CHECKPOINT_MANIFEST).read_bytes())
    except _UNREADABLE:
        return []
    return _differing_settings(saved.fingerprint_fields, current)


def _unusable_message(
    run_dir: Path, skipped: list[SkippedCandidate], setting_diffs: dict[str, list[tuple[str, Any, Any]]]
) -> str:
    if setting_diffs:
        # The same settings usually differ for every checkpoint; name each once.
        named: dict[str, tuple[Any, Any]] = {}
        for diffs in setting_diffs.values():
            for name, saved, now in diffs:
                named.setdefault(name, (saved, now))
        settings = (
            "; ".join(f"{name}: saved {_show(saved)}, now {_show(now)}" for name, (saved, now) in named.items())
            or "the settings differ but the saved ones could not be read back"
        )
        others = [s for s in skipped if s.path not in setting_diffs]
        also = "".join(f"\n  also {_rel(run_dir, Path(s.path))}: {s.problem}: {s.detail}" for s in others)
        return (
            f"the checkpoints in {run_dir} were written with different settings than this run uses ({settings}); "
            f"run again with the saved settings (they are in {run_dir / 'config.json'}) or start a new run "
            f"with another --run-dir{also}"
        )
    problems = "\n".join(f"  {_rel(run_dir, Path(s.path))}: {s.problem}: {s.detail}" for s in skipped)
    return (
        f"no trainer checkpoint in {checkpoint_root(run_dir)} can be used:\n{problems}\n"
        "the run directory's checkpoints are damaged; restore them from a backup or start a new run with another --run-dir"
    )


def refuse_config_change(run_dir: Path, fingerprint_fields: dict) -> None:
    """Before anything starts: refuse a restart whose settings no trainer checkpoint was written with.

    Reads only the checkpoint manifests (no digests), so it is cheap; `choose_source`
    still verifies everything later.
    """
    current = fingerprint_of(fingerprint_fields)
    diffs: dict[str, list[tuple[str, Any, Any]]] = {}
    skipped = []
    for step in _checkpoint_steps(run_dir):
        checkpoint_dir = checkpoint_root(run_dir) / f"step_{step}"
        try:
            manifest = TrainerCheckpointManifest.model_validate_json((checkpoint_dir / CHECKPOINT_MANIFEST).read_bytes())
        except _UNREADABLE:
            continue
        if manifest.config_fingerprint == current:
            return
        diffs[str(checkpoint_dir)] = _differing_settings(manifest.fingerprint_fields, fingerprint_fields)
        skipped.append(SkippedCandidate(path=str(checkpoint_dir), problem="fingerprint_differs",
                                        detail="written with other settings"))
    if diffs:
        raise UnusableRunDir(_unusable_message(run_dir, skipped, diffs))
