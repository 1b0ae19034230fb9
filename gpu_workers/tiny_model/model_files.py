"""What a model directory given as `model.path` must hold, checked without torch (before a run starts, or on the
node that loads it)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from turnkeep.config.loader import ConfigError

REQUIRED_FILES = ("config.json", "tokenizer.json")
"""The model's shape (transformers, vLLM) and its fast tokenizer (the agents' codec reads tokenizer.json)."""


class ModelUnusable(ConfigError):
    """The configured model cannot be used; the message names the setting and the fix."""


def check_model_files(path: Path, key: str = "model.path") -> Path:
    """`path`, given as the config's `key`, holds a model's config and fast tokenizer."""
    missing = [name for name in REQUIRED_FILES if not (Path(path) / name).is_file()]
    if missing:
        instead = ("remove model.path to use the made-up tiny model" if key == "model.path"
                   else f"remove {key} for the run's own starting weights")
        raise ModelUnusable(
            f"{key} = {str(path)!r} holds no {' and no '.join(missing)}. Point {key} at a Hugging "
            f"Face model directory (config.json, weights, tokenizer.json), or {instead}."
        )
    return Path(path)


def weight_names(path: Path) -> list[str]:
    """The tensor names in the model folder's safetensors files, from their headers (no tensor is read)."""
    names: list[str] = []
    for file in sorted(Path(path).glob("*.safetensors")):
        with file.open("rb") as weights:
            (length,) = struct.unpack("<Q", weights.read(8))
            names += [name for name in json.loads(weights.read(length)) if name != "__metadata__"]
    return names


def unknown_layers(names: list[str], targets: list[str]) -> list[str]:
    """The `targets` (layer names, or their dotted tails) that name no layer of a model with these weights."""
    layers = [name.removesuffix(".weight") for name in names if name.endswith(".weight")]
    return [target for target in targets if not any(is_target(layer, [target]) for layer in layers)]


def is_target(layer: str, targets: list[str]) -> bool:
    """Whether the layer (a weight's name less `.weight`) is one of `targets`, given whole or by a dotted tail, as
    peft matches `target_modules`."""
    return any(layer == target or layer.endswith("." + target) for target in targets)
