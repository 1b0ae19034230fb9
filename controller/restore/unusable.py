"""Why no checkpoint of a run directory can be used, in one message: the settings that changed (each named with
its saved and current value) or the damaged checkpoints; and the check before anything starts that refuses a
restart whose settings no trainer checkpoint was written with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from turnkeep.controller.stores.trainer_checkpoint import (
    CHECKPOINT_MANIFEST,
    checkpoint_root,
    fingerprint_of,
    published_steps,
)
from turnkeep.schemas.recovery import SkippedCandidate, TrainerCheckpointManifest


class UnusableRunDir(Exception):
    """No checkpoint in the run dir can be used; the message names the problem and the fix."""


def differing_settings(saved: Any, current: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted name, saved value, current value) for every leaf setting that differs."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out: list[tuple[str, Any, Any]] = []
        for key in sorted(set(saved) | set(current), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            out += differing_settings(saved.get(key, _ABSENT), current.get(key, _ABSENT), name)
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


def describe_settings(diffs: list[tuple[str, Any, Any]]) -> str:
    return "; ".join(f"{name}: saved {_show(saved)}, now {_show(now)}" for name, saved, now in diffs)


def relative_to_run(run_dir: Path, path: Path) -> str:
    try:
        return str(path.relative_to(run_dir))
    except ValueError:
        return str(path)


def saved_settings_diff(checkpoint_dir: Path, current: dict) -> list[tuple[str, Any, Any]]:
    try:
        saved = TrainerCheckpointManifest.model_validate_json((checkpoint_dir / CHECKPOINT_MANIFEST).read_bytes())
    except UNREADABLE:
        return []
    return differing_settings(saved.fingerprint_fields, current)


def unusable_message(
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
        also = "".join(f"\n  also {relative_to_run(run_dir, Path(s.path))}: {s.problem}: {s.detail}" for s in others)
        return (
            f"the checkpoints in {run_dir} were written with different settings than this run uses ({settings}); "
            f"run again with the saved settings (they are in {run_dir / 'config.json'}) or start a new run "
            f"with another --run-dir{also}"
        )
    problems = "\n".join(f"  {relative_to_run(run_dir, Path(s.path))}: {s.problem}: {s.detail}" for s in skipped)
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
    for step in reversed(published_steps(run_dir)):
        checkpoint_dir = checkpoint_root(run_dir) / f"step_{step}"
        try:
            manifest = TrainerCheckpointManifest.model_validate_json((checkpoint_dir / CHECKPOINT_MANIFEST).read_bytes())
        except UNREADABLE:
            continue
        if manifest.config_fingerprint == current:
            return
        diffs[str(checkpoint_dir)] = differing_settings(manifest.fingerprint_fields, fingerprint_fields)
        skipped.append(SkippedCandidate(path=str(checkpoint_dir), problem="fingerprint_differs",
                                        detail="written with other settings"))
    if diffs:
        raise UnusableRunDir(unusable_message(run_dir, skipped, diffs))


UNREADABLE = (OSError, ValueError, ValidationError)


def trainer_fingerprint_detail(
    checkpoint_dir: Path, manifest: TrainerCheckpointManifest, fingerprint: str, current: dict | None
) -> str:
    detail = (
        f"{checkpoint_dir / CHECKPOINT_MANIFEST} has config fingerprint {manifest.config_fingerprint}, the current "
        f"settings give {fingerprint}"
    )
    diffs = differing_settings(manifest.fingerprint_fields, current) if current is not None else []
    return f"{detail} ({describe_settings(diffs)})" if diffs else detail
