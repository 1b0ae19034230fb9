"""What a model directory given as `model.path` must hold, checked without torch (before a run starts, or on the
node that loads it)."""

from __future__ import annotations

from pathlib import Path

from turnkeep.config.loader import ConfigError

REQUIRED_FILES = ("config.json", "tokenizer.json")
"""The model's shape (transformers, vLLM) and its fast tokenizer (the agents' codec reads tokenizer.json)."""


class ModelUnusable(ConfigError):
    """The configured model cannot be used; the message names the setting and the fix."""


def check_model_files(path: Path) -> Path:
    missing = [name for name in REQUIRED_FILES if not (Path(path) / name).is_file()]
    if missing:
        raise ModelUnusable(
            f"model.path = {str(path)!r} holds no {' and no '.join(missing)}. Point model.path at a Hugging "
            f"Face model directory (config.json, weights, tokenizer.json), or remove "
            f"model.path to use the made-up tiny model."
        )
    return Path(path)
