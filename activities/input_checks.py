"""Checks of activity inputs, before anything moves.

Anyone who can reach the Temporal frontend can schedule an activity, so every one that
changes state checks its input first: ids must be this run's and this attempt's, counts
in range, and every path must resolve (symlinks and `..` resolved) to where this run
keeps that kind of thing. A refusal is one non-retryable error naming the field, the
value and what is allowed.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from temporalio.exceptions import ApplicationError

from turnkeep.primitives import snapshot_paths
from turnkeep.schemas.names import CHECKPOINT_HOLDER_PREFIX, ErrorType, checkpoint_id
from turnkeep.schemas.participant import MAX_LEASE_S, Artifact

SHA256 = re.compile(r"[0-9a-f]{64}")
_SHOWN_CHARS = 200


def refused(field: str, value: object, allowed: str) -> ApplicationError:
    """A refused input: one line naming the field, the value and what is allowed; never retried."""
    shown = repr(value)
    if len(shown) > _SHOWN_CHARS:
        shown = shown[:_SHOWN_CHARS] + "..."
    message = f"refused {field} = {shown}: {allowed}".replace("\n", " ").replace("\r", " ")
    return ApplicationError(message, type=ErrorType.INVALID_INPUT, non_retryable=True)


def check_int(field: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise refused(field, value, f"an integer >= {minimum}")
    return value


def check_run_id(field: str, value: object, run_id: str) -> None:
    if value != run_id:
        raise refused(field, value, f"this run's id {run_id!r}")


def check_attempt_id(field: str, value: object, run_id: str, step: int, number: int) -> None:
    expected = checkpoint_id(run_id, step, number)
    if value != expected:
        raise refused(field, value, f"{expected!r}, the id of this run's attempt {number} under step {step}")


def parse_attempt_id(field: str, value: object, run_id: str) -> tuple[int, int]:
    """(anchor step, number) of one of this run's attempt ids, spelled as `schemas.names.checkpoint_id` spells it."""
    prefix = f"{run_id}.snapshot."
    match = re.fullmatch(r"([0-9]{1,18})\.([0-9]{1,18})", value[len(prefix):]) if (
        isinstance(value, str) and value.startswith(prefix)) else None
    parsed = (int(match.group(1)), int(match.group(2))) if match else None
    if parsed is None or parsed[1] < 1 or checkpoint_id(run_id, *parsed) != value:
        raise refused(field, value, f"an attempt id of this run, '{prefix}<step>.<number>' (number >= 1)")
    return parsed


def resolved_inside(field: str, value: object, root: Path, run_dir: Path, what: str) -> Path:
    """`value` with symlinks and `..` resolved; refused unless it lies inside `root`, itself inside `run_dir`."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise refused(field, value, f"a path inside {what}")
    run_root = run_dir.resolve()
    root_resolved = root.resolve()
    if not root_resolved.is_relative_to(run_root):
        raise refused(field, value, f"a path inside {what}, but {root} resolves to {root_resolved}, outside the "
                                    f"run directory {run_root}")
    path = Path(value).resolve()
    if path == root_resolved or not path.is_relative_to(root_resolved):
        raise refused(field, value, f"a path inside {what} ({root_resolved}); it resolves to {path}")
    return path


def check_snapshot_root(field: str, step: int, run_dir: Path) -> Path:
    """`<run_dir>/checkpoints/step_<step>/snapshots`, refused when a symlink on the way leads elsewhere."""
    root = snapshot_paths.snapshots_root(run_dir, step)
    expected = snapshot_paths.snapshots_root(run_dir.resolve(), step)
    if root.resolve() != expected:
        raise refused(field, step, f"a step whose snapshot root is {expected}; it resolves to {root.resolve()}")
    return expected


def check_staging_dir(field: str, value: object, run_dir: Path, step: int, number: int) -> Path:
    """The attempt's own staging directory, resolved:
    `<run_dir>/checkpoints/step_<step>/snapshots/.staging-<number>-*`."""
    root = check_snapshot_root("anchor_step", step, run_dir)
    allowed = f"the staging directory of attempt {number}, {root}/.staging-{number}-<hex>"
    if not isinstance(value, str) or not value or "\x00" in value:
        raise refused(field, value, allowed)
    path = Path(value).resolve()
    if path.parent != root or snapshot_paths.staging_number(path.name) != number:
        raise refused(field, value, f"{allowed}; it resolves to {path}")
    return path


def check_artifacts(field: str, artifacts: list[Artifact], staging: Path) -> None:
    """Each artifact a relative path that stays inside the staging directory, with a sha256 and a size."""
    for i, artifact in enumerate(artifacts):
        rel = PurePosixPath(artifact.path)
        # In this order: a NUL byte or '..' never reaches resolve().
        if ("\x00" in artifact.path or not rel.parts or rel.is_absolute() or ".." in rel.parts
                or rel == PurePosixPath(snapshot_paths.MANIFEST)
                or not (staging / rel).resolve().is_relative_to(staging)):
            raise refused(f"{field}[{i}].path", artifact.path,
                          "a relative path without '..' that stays inside the staging directory (not the manifest)")
        if not SHA256.fullmatch(artifact.sha256):
            raise refused(f"{field}[{i}].sha256", artifact.sha256, "64 lowercase hex digits")
        check_int(f"{field}[{i}].bytes", artifact.bytes, 0)


def check_lease(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_LEASE_S:
        raise refused(field, value, f"a number of seconds in (0, {MAX_LEASE_S:g}]")
    return float(value)


HOLDER = re.compile(rf"snapshot:[A-Za-z0-9][A-Za-z0-9._:@-]{{0,255}}|{re.escape(CHECKPOINT_HOLDER_PREFIX)}[0-9]{{1,18}}")


def check_holder(field: str, value: object) -> str:
    """A trainer hold's holder: an attempt (`snapshot:<checkpoint id>`) or a checkpoint (`checkpoint:<step>`)."""
    if not isinstance(value, str) or not HOLDER.fullmatch(value):
        raise refused(field, value, f"'snapshot:<checkpoint id>' or '{CHECKPOINT_HOLDER_PREFIX}<step>'")
    return value


def check_staging_shape(field: str, value: object, attempt_id: str) -> Path:
    """For a process that does not know the run directory (the policy server): the attempt's staging
    directory by its shape, `<...>/checkpoints/step_<step>/snapshots/.staging-<number>-<hex>`."""
    step_number = attempt_id.rsplit(".", 2)[-2:] if isinstance(attempt_id, str) else []
    allowed = f"the staging directory of attempt {attempt_id}, <run>/checkpoints/step_<step>/snapshots/.staging-<n>-<hex>"
    if len(step_number) != 2 or not all(part.isdigit() for part in step_number):
        raise refused("checkpoint_id", attempt_id, "an attempt id '<run_id>.snapshot.<step>.<number>'")
    step, number = (int(part) for part in step_number)
    if not isinstance(value, str) or "\x00" in value:
        raise refused(field, value, allowed)
    path = Path(value)
    if (not path.is_absolute() or ".." in path.parts or path.parent.name != "snapshots"
            or path.parent.parent.name != f"step_{step}" or path.parent.parent.parent.name != "checkpoints"
            or snapshot_paths.staging_number(path.name) != number):
        raise refused(field, value, allowed)
    return path
