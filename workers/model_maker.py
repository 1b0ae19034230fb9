"""The model a run trains: the configured `model.path`, or the tiny model made (once, cached) from the
transcripts this run's environments hand in."""

from __future__ import annotations

from pathlib import Path

from gpu_workers.tiny_model.build import EVAL_ROLLOUTS, ensure_tiny_model
from gpu_workers.tiny_model.transcripts import demonstration_source
from schemas.config import TurnkeepConfig


def tiny_model_dir(cfg: TurnkeepConfig, eval_rollouts: int = EVAL_ROLLOUTS) -> Path:
    demonstrations = demonstration_source(cfg) if cfg.model.path is None else None
    return ensure_tiny_model(cfg.model, cfg.task, cfg.run.seed, eval_rollouts=eval_rollouts,
                             demonstrations=demonstrations)
