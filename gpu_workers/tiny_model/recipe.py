"""What shapes the tiny model's bytes, and the cache key that names its directory: torch-free, so a run can
find a model made before without starting a process that imports torch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from turnkeep.gpu_workers.tiny_model.transcripts import TranscriptSource
from turnkeep.schemas.config import ModelConfig, TinyModelConfig

FORMAT_VERSION = 2
"""Bump when the recipe or the saved files change (2: the chat template) so old caches are not reused."""
RECIPE_FILE = "turnkeep_tiny.json"
"""What the directory was made from, plus the measured starting reward."""


@dataclass(frozen=True)
class Recipe:
    """Everything that shapes the tiny model's bytes."""

    tiny: TinyModelConfig
    source: TranscriptSource
    seed: int

    def as_json(self) -> dict:
        tiny = self.tiny.model_dump(mode="json")
        if tiny["num_kv_heads"] is None:
            # Added later: an unset one keeps the keys (and so the caches) of models made before it existed.
            del tiny["num_kv_heads"]
        # The name of the environment does not shape the weights; its entry, options and content do (its recipe).
        del tiny["demonstrations"]
        if not self.source.error_rate_applies:
            del tiny["warm_start_error_rate"]
        return {"format": FORMAT_VERSION, "tiny": tiny, **self.source.recipe(self.seed), "seed": self.seed}

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.as_json(), sort_keys=True).encode()).hexdigest()[:16]


def cache_key(tiny: TinyModelConfig, source: TranscriptSource, seed: int) -> str:
    """The hash that names the cached directory (`tiny-<key>`)."""
    return Recipe(tiny, source, seed).key()


def cached_model_dir(model_cfg: ModelConfig, source: TranscriptSource, seed: int) -> Path | None:
    """The tiny model's directory when it was made before (None: it must be made)."""
    final = model_cfg.cache_dir.expanduser() / f"tiny-{cache_key(model_cfg.tiny, source, seed)}"
    return final if final.is_dir() else None
