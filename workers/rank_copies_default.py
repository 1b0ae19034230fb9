"""`train.rank_copies` left unset: decided from the model's size before anything starts, so every process reads the
same answer. A copy is the shard's weights and both AdamW moments (three times the fp32 weights) to two keepers after
every step: cheap for the tiny model; for SmolLM2-135M on 2 cores, 1.6 GB a copy and 26 s of a 172 s step, and up to
6.4 GB of the keepers' memory by that size."""

from __future__ import annotations

import logging
from pathlib import Path

from turnkeep.schemas.config import TurnkeepConfig

log = logging.getLogger("turnkeep.run")

AUTO_MAX_WEIGHT_BYTES = 64 << 20
"""Weights at most this large (safetensors on disk) get rank copies by default."""


def with_rank_copies_decided(cfg: TurnkeepConfig) -> TurnkeepConfig:
    """`cfg` with `train.rank_copies` set; call it after the model path is a folder (`with_model_resolved`)."""
    if cfg.train.rank_copies is not None:
        return cfg
    weights = weight_bytes(Path(cfg.model.path)) if cfg.model.path is not None else 0
    on = weights <= AUTO_MAX_WEIGHT_BYTES
    if not on:
        log.info("train.rank_copies is off for a model of %.0f MiB of weights (each step would copy about %.1f GB "
                 "of weights and optimizer state to two keepers); set train.rank_copies = true to keep steps through "
                 "a trainer's death", weights / 2**20, 3 * weights / 1e9)
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"rank_copies": on})})


def weight_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.expanduser().glob("*.safetensors"))
