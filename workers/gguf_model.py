"""A `.gguf` file as a model folder: dequantized once by transformers' GGUF loader into a Hugging Face folder
(config without a quantization config, safetensors weights, the tokenizer with its chat template) in a cache
keyed by the file's sha256, so every process of every incarnation reads the same folder and a second start
converts nothing.

The folder is written under a staging name, fsynced and renamed into place (`primitives/atomic_files`): a crash
mid-conversion leaves no half folder under the final name, and two processes that convert at once both end with
the one published folder.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import version
import logging
import time
from pathlib import Path

from turnkeep.config.loader import ConfigError
from turnkeep.primitives.atomic_files import atomic_write_json, publish_dir, remove_dir, sha256_file, staging_dir

log = logging.getLogger("turnkeep.model")

MARKER = "turnkeep-gguf.json"
"""Written last into a converted folder: the source file, its digest, and the versions that converted it."""
GGUF_INSTALL = "pip install 'gguf==0.19.0'"
"""What a missing `gguf` package needs (pyproject's `smollm2` extra holds the same pin)."""


def is_gguf_file(path: Path) -> bool:
    return path.suffix.lower() == ".gguf"


def gguf_model_folder(file: Path, cache_dir: Path, key: str = "model.path") -> Path:
    """The converted folder of GGUF `file` in `cache_dir/gguf/`, converting it first when it is not there."""
    if not file.is_file():
        raise ConfigError(f"{key} = {str(file)!r}: no such GGUF file; give an existing .gguf file, a model "
                          "folder, or a packaged model's name (`turnkeep model list`)")
    digest = sha256_file(file)
    folder = cache_dir.expanduser() / "gguf" / f"{file.stem}-{digest[:16]}"
    if (folder / MARKER).is_file():
        return folder
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"{key} = {str(file)!r} is a GGUF file, and reading it needs the gguf package: "
                          f"{GGUF_INSTALL}")
    _convert(file, digest, folder)
    return folder


def _convert(file: Path, digest: str, folder: Path) -> None:
    started = time.monotonic()
    print(f"turnkeep: converting {file.name} (GGUF) into {folder} once (dequantized; about 30 s for 135M "
          "parameters)", flush=True)
    staging = staging_dir(folder.parent, folder.name)
    try:
        _write_folder(file, staging)
        atomic_write_json(staging / MARKER, {"source": str(file), "sha256": digest, **_versions()})
    except BaseException:
        remove_dir(staging)
        raise
    try:
        publish_dir(staging, folder)
    except FileExistsError:  # another process converted the same file meanwhile: its folder is the same
        remove_dir(staging)
    log.info("converted %s into %s in %.1fs", file.name, folder, time.monotonic() - started)


def _write_folder(file: Path, out: Path) -> None:
    """Dequantize `file` and save it as a plain Hugging Face folder in `out`. transformers refuses to save a model
    loaded from GGUF (its config carries a GGUF quantization config), so the weights move into a model built from
    the same config without it."""
    # Late imports: torch and transformers come with the trainer's extra, and only a GGUF model needs them here.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    # dequantize=True: transformers may keep some architectures' GGUF weights packed (with the `kernels` package)
    loaded = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32,
                                                  quantization_config=GgufConfig(dequantize=True))
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = file.stem
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise ConfigError(f"{file}: its weights do not fit the model its own config describes (missing "
                          f"{missing[:3]}, unexpected {unexpected[:3]}); convert it with llama.cpp's tools instead")
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _versions() -> dict[str, str]:
    return {name: version(name) for name in ("gguf", "transformers")}
