"""Running totals in metrics.jsonl (`*_total`) that go on across incarnations: a restored run starts from the totals
its lineage had at the step it was restored to, not from zero."""

from __future__ import annotations

from pathlib import Path

import orjson

from turnkeep.schemas.choices import MetricsKind

TOTALS = ("rows_sealed_total", "retries_total", "rollouts_interrupted_total", "siblings_dropped_total",
          "groups_discarded_total", "groups_zero_signal_total", "recovery_by_env_total")


def totals_at(path: Path, step: int) -> dict:
    """The totals of the newest train-step line for `step` in `path` (the lineage a restore to `step` continues);
    empty when there is none (a fresh run, or a step no incarnation reported)."""
    try:
        raw = path.read_bytes().splitlines()
    except OSError:
        return {}
    for line in reversed(raw):
        try:
            value = orjson.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(value, dict) and value.get("kind") == MetricsKind.TRAIN_STEP and value.get("step") == step:
            return {key: value[key] for key in TOTALS if key in value}
    return {}


def add_totals(base: dict, current: dict) -> dict:
    """`current` (this incarnation's counts) on top of `base`: numbers add, dicts add key by key, nested too."""
    return {key: _add(base.get(key), value) for key, value in current.items()}


def _add(base, value):
    if base is None:
        return value
    if isinstance(value, dict) and isinstance(base, dict):
        return {key: _add(base.get(key), value[key]) if key in value else base[key]
                for key in sorted(set(base) | set(value))}
    return base + value
