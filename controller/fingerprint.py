"""The config fingerprint stored in every snapshot manifest.

It covers only the settings a restored snapshot depends on (the model, the task, the
group shape, the seed and the environments' kinds); changing the step count, ports or snapshot cadence does not
make old snapshots unusable.
"""

from __future__ import annotations

import hashlib

import orjson

from turnkeep.schemas.config import TurnkeepConfig


def fingerprint_fields(cfg: TurnkeepConfig) -> dict:
    return {
        # An unset revision is left out: run directories written before the key existed keep their fingerprint.
        "model": cfg.model.model_dump(mode="json", exclude={"cache_dir"} | ({"revision"} if cfg.model.revision is None
                                                                            else set())),
        "task": cfg.task.model_dump(mode="json"),
        "rollout.group_size": cfg.rollout.group_size,
        "rollout.max_turns": cfg.rollout.max_turns,
        "run.seed": cfg.run.seed,
        # Which environment runs a saved group, and how it restores, depends on these.
        "environments": {name: {"kind": spec.kind, "group_size": spec.group_size}
                         for name, spec in sorted(cfg.environments.items())},
    }


def config_fingerprint(cfg: TurnkeepConfig) -> str:
    blob = orjson.dumps(fingerprint_fields(cfg), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:16]


def process_digest(cfg: TurnkeepConfig) -> str:
    """The config the run's processes were started with, as a digest: a restarted controller reuses a surviving
    trainer, policy server or environment server only when it would have started it with the same settings.
    `run.steps`, `[watchdog]`, `[metrics]` and `[eval]` (the controller's; an evaluation's temperature travels with
    each of its requests) are left out: they change nothing those processes do."""
    dumped = cfg.model_dump_json(exclude={"run": {"steps"}, "watchdog": True, "metrics": True, "eval": True})
    return hashlib.sha256(dumped.encode()).hexdigest()[:16]
