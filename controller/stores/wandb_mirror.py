"""`[metrics] wandb = true`: the lines of metrics.jsonl sent to Weights & Biases, beside (or instead of) TensorBoard.

A mirror like the TensorBoard one (`controller.stores.metrics_tail`: each line exactly once across restarts, the
offset in `<run_dir>/wandb/mirrored_offset`). One W&B run per turnkeep run, its id derived from the run id, so every
incarnation writes into the same W&B run when online. Train-step numbers go under `train/` plotted against
`train/step`, snapshot attempts' under `snapshot/` against `snapshot/anchor_step` (with `snapshot/published` 1 or 0),
restores as `recovery/step`: W&B's own step only grows, and a restore sends the run back to an earlier train step.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from turnkeep.controller.stores.metrics_tail import MetricsTail, numbers
from turnkeep.schemas.choices import MetricsKind
from turnkeep.schemas.config import MetricsConfig

log = logging.getLogger("turnkeep.metrics")

WANDB_DIR = "wandb"
NOT_MEASURED = {"t"}


class WandbUnavailable(RuntimeError):
    """`metrics.wandb = true` without the wandb package; the message names the install."""


def check_wandb_installed() -> None:

    if importlib.util.find_spec("wandb") is None:
        raise WandbUnavailable("metrics.wandb = true needs the wandb package: pip install 'turnkeep[wandb]' (or "
                               "set metrics.wandb = false)")


def resolved_mode(config: MetricsConfig) -> str:
    if config.wandb_mode != "auto":
        return config.wandb_mode
    return "online" if _has_credentials() else "offline"


class WandbMirror:
    def __init__(self, run_dir: Path, run_id: str, config: MetricsConfig) -> None:
        import wandb  # only runs that ask for W&B import it

        self._dir = Path(run_dir) / WANDB_DIR
        self._dir.mkdir(exist_ok=True)
        self.mode = resolved_mode(config)
        self._run = wandb.init(
            project=config.wandb_project, entity=config.wandb_entity, name=run_id, id=wandb_run_id(run_id),
            resume="allow" if self.mode == "online" else None, dir=str(run_dir), mode=self.mode,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )
        for axis, prefix in (("train/step", "train/*"), ("snapshot/anchor_step", "snapshot/*")):
            self._run.define_metric(axis)
            self._run.define_metric(prefix, step_metric=axis)
        self._tail = MetricsTail(run_dir, self._dir)
        log.info("metrics go to W&B (%s) as run %s of project %s", self.mode, wandb_run_id(run_id),
                 config.wandb_project)

    def mirror_new_lines(self) -> int:
        records = self._tail.read_new()
        for record in records:
            point = wandb_point(record)
            if point:
                self._run.log(point)
        self._tail.commit()
        return len(records)

    def close(self) -> None:
        self.mirror_new_lines()
        self._run.finish()


def wandb_point(record: dict) -> dict[str, float]:
    """One metrics.jsonl line as one W&B log call ({} for a line W&B gets nothing of)."""
    kind = record.get("kind")
    if kind == MetricsKind.TRAIN_STEP:
        return {f"train/{key}": value for key, value in numbers(record) if key not in NOT_MEASURED}
    if kind == MetricsKind.SNAPSHOT:
        point = {f"snapshot/{key}": value for key, value in numbers(record) if key not in NOT_MEASURED}
        point["snapshot/published"] = float(str(record.get("outcome", "")).startswith("published"))
        return point
    if kind == MetricsKind.EVAL:
        return {"eval/step": float(record.get("step", 0)),
                **{f"eval/{key}": value for key, value in numbers(record) if key not in NOT_MEASURED}}
    if kind == MetricsKind.RECOVERY:
        source = record.get("source") or {}
        return {"recovery/step": float(source.get("step") or 0),
                "recovery/incarnation": float(record.get("incarnation") or 0)}
    return {}


def wandb_run_id(run_id: str) -> str:
    """W&B run ids allow letters, digits, dashes and underscores."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in run_id)[:64]


def _has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:  # what `wandb login` leaves (W&B's own reader of it)
        import wandb  # an optional extra: loaded only when the run mirrors to W&B
        from wandb.sdk.lib.wbauth.wbnetrc import read_netrc_auth

        return read_netrc_auth(host=wandb.Settings().base_url) is not None
    except Exception:  # noqa: BLE001 - any failure to find credentials means offline, which loses nothing
        return False
