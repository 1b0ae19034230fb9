"""`turnkeep status RUN_DIR`, from the files: what a run is doing, or what it last did.

Everything here reads; nothing is written or removed, so it is safe against a live run.
The files: `run.json` (run id, incarnation), `pids/` (which of the run's processes still
run), `status.json` (the live controller's step and gate holders, `controller.live_status`),
the tail of `metrics.jsonl` (the last train step, snapshot attempt and recovery) and the
newest published snapshot's manifest. `run_status_temporal` adds what Temporal knows when
the run is up.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from turnkeep.controller.live_status import LIVE_STATUS_FILE
from turnkeep.controller.stores import snapshot_store
from turnkeep.controller.stores.trainer_checkpoint import published_steps
from turnkeep.primitives import snapshot_paths
from turnkeep.primitives.pid_files import PIDS_DIR, live_pid
from turnkeep.schemas.choices import MetricsKind

TAIL_BYTES = 1 << 20
"""How much of the end of metrics.jsonl is read for the last line of each kind."""


class NotARunDir(ValueError):
    """The directory holds no run; the message says what is missing."""


def gather(run_dir: Path, now: float | None = None) -> dict:
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    run = _read_json(run_dir / "run.json")
    if run is None:
        raise NotARunDir(f"{run_dir} is not a run directory (no run.json); pass the --run-dir of a `turnkeep run`")
    roles = sorted(p.stem for p in (run_dir / PIDS_DIR).glob("*.json")) if (run_dir / PIDS_DIR).is_dir() else []
    processes = {role: live_pid(run_dir, role) for role in roles}
    last = _last_metrics(run_dir / "metrics.jsonl", (MetricsKind.TRAIN_STEP, MetricsKind.SNAPSHOT, MetricsKind.RECOVERY,
                                                     MetricsKind.EVAL))
    return {
        "run_id": run.get("run_id"), "incarnation": run.get("incarnation"), "run_dir": str(run_dir),
        "up": processes.get("controller") is not None,
        "processes": processes,
        "live": _live(run_dir, now),
        "training": _training(last.get("train_step"), run_dir / "metrics.jsonl", now),
        "last_attempt": _attempt(last.get("snapshot")),
        "last_recovery": _recovery(last.get("recovery")),
        "last_eval": last.get("eval"),
        "newest_snapshot": _newest_snapshot(run_dir, now),
        "temporal": _temporal_addresses(run_dir),
    }


def _read_json(path: Path) -> dict | None:
    try:
        value = orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _last_metrics(path: Path, kinds: tuple[str, ...]) -> dict[str, dict]:
    """The last line of each kind, from the end of the file (a torn last line is skipped)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            lines = f.read().splitlines()
    except OSError:
        return {}
    found: dict[str, dict] = {}
    for line in reversed(lines):
        try:
            record = orjson.loads(line)
        except ValueError:
            continue
        kind = record.get("kind") if isinstance(record, dict) else None
        if kind in kinds and kind not in found:
            found[kind] = record
            if len(found) == len(kinds):
                break
    return found


def _live(run_dir: Path, now: float) -> dict | None:
    status = _read_json(run_dir / LIVE_STATUS_FILE)
    if status is None:
        return None
    return {**status, "age_s": round(now - float(status.get("t", now)), 1)}


def _training(step: dict | None, metrics: Path, now: float) -> dict | None:
    if step is None:
        return None
    try:
        age = round(now - metrics.stat().st_mtime, 1)
    except OSError:
        age = None
    keys = ("step", "policy_version", "reward_mean", "rollout_tokens_per_s", "train_step_s", "staleness_max",
            "engine_tokens_per_s")
    return {**{k: step.get(k) for k in keys}, "metrics_age_s": age}


def _attempt(line: dict | None) -> dict | None:
    if line is None:
        return None
    keys = ("checkpoint_id", "outcome", "reason", "anchor_step", "trigger", "parked_agents", "journaled_agents",
            "data_plane_rows", "admission_closed_s", "wall_s")
    return {k: line.get(k) for k in keys}


def _recovery(line: dict | None) -> dict | None:
    if line is None:
        return None
    source = line.get("source") or {}
    return {"incarnation": line.get("incarnation"), "source": source.get("kind"), "step": source.get("step"),
            "reason": source.get("reason"), "superseded": line.get("superseded")}


def _newest_snapshot(run_dir: Path, now: float) -> dict | None:
    for step in reversed(published_steps(run_dir)):
        root = snapshot_paths.snapshots_root(run_dir, step)
        for number in reversed(snapshot_store.published(root)):
            manifest = _read_json(root / str(number) / snapshot_paths.MANIFEST)
            if manifest is None:
                continue
            created = float(manifest.get("created_unix_s", now))
            return {"dir": str((root / str(number)).relative_to(run_dir)), "step": manifest.get("anchor_step"),
                    "policy_version": manifest.get("policy_version"), "age_s": round(now - created, 1),
                    "counts": manifest.get("counts", {})}
    return None


def _temporal_addresses(run_dir: Path) -> dict | None:
    embedded = _read_json(run_dir / PIDS_DIR / "temporal.json")
    if embedded is not None:
        return {"address": embedded.get("address"), "ui": embedded.get("ui_url"),
                "namespace": embedded.get("namespace"), "embedded": True,
                "server_running": live_pid(run_dir, "temporal") is not None}
    config = _read_json(run_dir / "config.json") or {}
    temporal = config.get("temporal") or {}
    if temporal.get("address"):
        return {"address": temporal["address"], "ui": None, "namespace": temporal.get("namespace"),
                "embedded": False, "server_running": None}
    return None
