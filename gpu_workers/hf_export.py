"""A trainer checkpoint's weights as Hugging Face weight files: the model's part of a checkpoint's DCP folder
(`trainer/shards/`, written by any number of ranks) read whole into this process's memory on the CPU, checked
against the names and shapes of the model's own weight files, cast to the run's dtype, and written as safetensors
(`model.safetensors`, or shards and their index, named as transformers names them).

Reading goes through DCP itself, not a reader of our own: the checkpoint's metadata (every tensor's global shape
and dtype, whatever the rank count that wrote it) gives one empty full-size tensor per weight, and `dcp.load`
without a process group fills them from the shard files, resharding as it does when M ranks load N ranks'
checkpoint. The public `FileSystemReader.read_metadata` and `dcp.load` are used rather than the private
`_load_state_dict_from_keys` or `dcp_to_torch_save` (which writes the whole checkpoint, AdamW moments too, to one
file first). The AdamW state beside the weights is never read.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from huggingface_hub import save_torch_state_dict
from safetensors import safe_open
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from turnkeep.gpu_workers.rank_compute import DTYPES

MODEL_KEY = "model"
"""The weights' key in the state dict `RankCompute.save` writes (`{"model": ..., "optim": ...}`)."""
DEFAULT_SHARD_SIZE = "5GB"
"""The largest weight file before the weights are split (transformers' own default)."""
DTYPE_KEYS = ("dtype", "torch_dtype")
"""Where a model's config.json names its weights' dtype (transformers 5 writes `dtype`, older ones `torch_dtype`)."""


class CheckpointUnreadable(Exception):
    """The DCP folder cannot be read as a model's weights; the message names the folder and the error."""


class ForeignWeights(Exception):
    """The checkpoint's weights are not the model's: a name it lacks, a shape that differs, a weight it has not."""


def read_model_state(shards: Path) -> dict[str, torch.Tensor]:
    """Every weight of the model in the DCP folder `shards`, whole, on the CPU, in the dtype it was saved in."""
    try:
        metadata = dcp.FileSystemReader(str(shards)).read_metadata()
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError) as err:
        raise CheckpointUnreadable(f"{shards}/.metadata cannot be read ({type(err).__name__}: {err})") from None
    state: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        path = (metadata.planner_data or {}).get(key) or ()
        if len(path) < 2 or path[0] != MODEL_KEY or not isinstance(meta, TensorStorageMetadata):
            continue  # the optimizer's state, or a value that is no tensor
        state[".".join(str(part) for part in path[1:])] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not state:
        raise CheckpointUnreadable(f"{shards} holds no model weights (no '{MODEL_KEY}.*' tensor in its metadata)")
    try:
        with warnings.catch_warnings():
            # DCP warns that it loads outside a process group: one process reading every shard is the intent.
            warnings.filterwarnings("ignore", message="torch.distributed is")
            dcp.load({MODEL_KEY: state}, checkpoint_id=str(shards))
    except Exception as err:  # DCP wraps a failed read (a missing or short shard file) in CheckpointException
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise CheckpointUnreadable(f"{shards} cannot be read by torch.distributed.checkpoint "
                                   f"({type(err).__name__}: {first})") from None
    return state


def weight_shapes(model_dir: Path) -> dict[str, tuple[int, ...]] | None:
    """Name and shape of every tensor in the model's own safetensors files (their headers only); None when it has
    none (weights in another format)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():
                shapes[name] = tuple(weights.get_slice(name).get_shape())
    return shapes


def fit_to_model(state: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]] | None, dtype: str,
                 model_dir: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's weights under the names of the model's own files, cast to `dtype`. A name only the
    checkpoint has must be a tied copy of one kept (an output layer that shares the input embedding: the trainer's
    state dict names both, transformers saves it once); anything else is a foreign checkpoint."""
    names = list(shapes) if shapes is not None else list(state)
    missing = [name for name in names if name not in state]
    if missing:
        raise ForeignWeights(f"it lacks {_few(missing)}, which the model at {model_dir} has")
    differ = [f"{name} {tuple(state[name].shape)} (the model's: {shapes[name]})" for name in names
              if shapes is not None and tuple(state[name].shape) != shapes[name]]
    if differ:
        raise ForeignWeights(f"its weights have other shapes than the model at {model_dir}: {_few(differ)}")
    kept = set(names)
    untied = [extra for extra in state if extra not in kept and not _copy_of_one(state, extra, kept)]
    if untied:
        raise ForeignWeights(f"it holds {_few(untied)}, which the model at {model_dir} has not")
    target = DTYPES[dtype]
    return {name: state[name].to(target) for name in names}


def _copy_of_one(state: dict[str, torch.Tensor], extra: str, kept: set[str]) -> bool:
    tensor = state[extra]
    return any(state[name].shape == tensor.shape and torch.equal(state[name], tensor) for name in kept)


def _few(items: list[str]) -> str:
    return ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def write_weights(state: dict[str, torch.Tensor], folder: Path, max_shard_size: int | str = DEFAULT_SHARD_SIZE) -> None:
    """`state` as safetensors in `folder`: one `model.safetensors`, or shards over `max_shard_size` and
    `model.safetensors.index.json`, the layout `from_pretrained` and vLLM read."""
    before = {path.name for path in folder.iterdir()}
    # huggingface_hub logs "Model weights successfully saved to <folder>" at INFO: the staging folder's name, which
    # the export renames a moment later, would only mislead.
    hub_log = logging.getLogger(sys.modules[save_torch_state_dict.__module__].__file__)
    level = hub_log.level
    hub_log.setLevel(logging.WARNING)
    try:
        save_torch_state_dict(state, folder, max_shard_size=max_shard_size)
    finally:
        hub_log.setLevel(level)
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.iterdir():
        if path.name not in before:
            path.chmod(0o666 & ~mask)  # as the files beside them: safetensors writes its files 0600


def set_config_dtype(config_file: Path, dtype: str) -> None:
    """The model's config.json names the dtype of the weights beside it (transformers and vLLM load in it)."""
    config = json.loads(config_file.read_text())
    keys = [key for key in DTYPE_KEYS if key in config] or [DTYPE_KEYS[0]]
    for key in keys:
        config[key] = dtype
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def ensure_generation_config(folder: Path) -> None:
    """A generation_config.json beside the weights: the model's own when it had one, else transformers' default
    for its config (its bos, eos and pad token ids)."""
    if (folder / "generation_config.json").is_file():
        return
    from transformers import AutoConfig, GenerationConfig  # transformers: loaded only for a model without one

    GenerationConfig.from_model_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
