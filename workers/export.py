"""`turnkeep export`: a trainer checkpoint of a run directory as a Hugging Face model folder that transformers'
`from_pretrained` and vLLM load: the checkpoint's weights (`gpu_workers.hf_export`) in the run's `model.dtype`
(a LoRA run's adapters merged into the base model's weights), beside the config, tokenizer files, chat template and generation config of the model folder the run trained from.

Nothing is ever half-written: the folder is built in a staging folder beside `--out` and renamed to it only when
complete (fsynced first); a failure or an interrupt removes the staging folder. `--out` must not exist yet, or be
an empty folder.
"""

from __future__ import annotations

import fnmatch
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from safetensors.torch import load_file

from turnkeep.gpu_workers.hf_export import (
    DEFAULT_SHARD_SIZE,
    CheckpointUnreadable,
    ForeignWeights,
    ensure_generation_config,
    fit_to_model,
    read_model_state,
    set_config_dtype,
    weight_shapes,
    write_weights,
)
from turnkeep.gpu_workers.lora import is_adapter_key, merge_into
from turnkeep.gpu_workers.rank_compute import SHARDS
from turnkeep.gpu_workers.tiny_model.recipe import RECIPE_FILE
from turnkeep.gpu_workers.trainer import TRAINER_STATE
from turnkeep.primitives.atomic_files import publish_dir, staging_dir
from turnkeep.workers.export_source import ExportRefused, ExportSource, export_source, other_steps

__all__ = ["ExportRefused", "Exported", "export_checkpoint"]

COPIED = ("*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken")
"""The model folder's files an export carries over: config, generation config, tokenizer files and chat template
(the patterns a run fetches of a hub model, less its weights)."""
NOT_COPIED = ("*.safetensors.index.json", "*.bin.index.json", RECIPE_FILE)
"""The model's own weight index (the export writes its own) and the tiny model's recipe (it describes the model
before training)."""


@dataclass(frozen=True)
class Exported:
    folder: Path
    step: int
    bytes: int
    seconds: float

    def line(self, run_dir: Path) -> str:
        return (f"turnkeep export: {self.folder} (trainer checkpoint step {self.step} of {run_dir}): "
                f"{self.bytes} bytes written in {self.seconds:.1f} s")


def export_checkpoint(run_dir: Path, out: Path, step: int | None = None,
                      max_shard_size: int | str = DEFAULT_SHARD_SIZE) -> Exported:
    """Write the trainer checkpoint of `step` (None: the newest) of `run_dir` to the new folder `out`."""
    started = time.monotonic()
    _refuse_taken(out)
    source = export_source(run_dir, step)
    try:
        staging = staging_dir(out.parent, out.name)
    except (OSError, ValueError) as err:  # ValueError: an --out with no name of its own (".", "/")
        raise ExportRefused(f"cannot write beside --out {out} ({err}); pick an --out in a folder you can write to") \
            from None
    try:
        _copy_model_files(source.model_dir, staging)
        _write_weights(source, staging, max_shard_size)
        set_config_dtype(staging / "config.json", source.dtype)
        ensure_generation_config(staging)
        _publish(staging, out)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, OSError):
            raise ExportRefused(f"writing {out} failed ({err}); nothing was left behind: free space or pick "
                                "another --out") from None
        raise
    written = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    return Exported(out, source.step, written, time.monotonic() - started)


def _refuse_taken(out: Path) -> None:
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    if out.exists() or out.is_symlink():
        raise ExportRefused(f"--out {out} exists and is not an empty folder; pass a new folder (or empty it), "
                            "nothing was written")


def _copy_model_files(model_dir: Path, staging: Path) -> None:
    copied = [path for path in sorted(model_dir.iterdir()) if path.is_file()
              and any(fnmatch.fnmatch(path.name, p) for p in COPIED)
              and not any(fnmatch.fnmatch(path.name, p) for p in NOT_COPIED)]
    if not any(path.name == "config.json" for path in copied):
        raise ExportRefused(f"the model folder {model_dir} holds no config.json to export beside the weights")
    for path in copied:
        shutil.copyfile(path, staging / path.name)  # not copy2: the export gets this user's usual permissions


def _write_weights(source: ExportSource, staging: Path, max_shard_size: int | str) -> None:
    try:
        state = read_model_state(source.checkpoint / "trainer" / SHARDS)
        if any(is_adapter_key(name) for name in state):
            state = _adapters_merged(source, state)
        weights = fit_to_model(state, weight_shapes(source.model_dir), source.dtype, source.model_dir)
    except CheckpointUnreadable as err:
        raise ExportRefused(f"trainer checkpoint {source.checkpoint} cannot be read: {err}. "
                            f"{other_steps(source.checkpoint.parents[1], source.step)}") from None
    except ForeignWeights as err:
        raise ExportRefused(f"trainer checkpoint {source.checkpoint} is not of the model the run trained: {err}. "
                            f"{other_steps(source.checkpoint.parents[1], source.step)}") from None
    del state
    write_weights(weights, staging, max_shard_size)


def _adapters_merged(source: ExportSource, adapters: dict) -> dict:
    """A LoRA checkpoint's adapters merged into the weights of the model folder the run trained from."""
    lora = orjson.loads((source.checkpoint / "trainer" / TRAINER_STATE).read_bytes()).get("lora")
    if not lora:
        raise ExportRefused(f"trainer checkpoint {source.checkpoint} holds LoRA adapters but its {TRAINER_STATE} "
                            "names no rank and alpha to merge them with. "
                            f"{other_steps(source.checkpoint.parents[1], source.step)}")
    base: dict = {}
    for file in sorted(source.model_dir.glob("*.safetensors")):
        base.update(load_file(file))
    try:
        return merge_into(base, adapters, lora["alpha"] / lora["rank"])
    except KeyError as err:
        raise ForeignWeights(f"it holds {err.args[0]} at {source.model_dir}") from None


def _publish(staging: Path, out: Path) -> None:
    """Rename the complete folder to `out`; an empty `out` (checked before anything was written) goes first."""
    if out.is_dir() and not out.is_symlink():
        try:
            out.rmdir()
        except OSError:
            raise ExportRefused(f"--out {out} was filled while the export was written; pass a new folder, nothing "
                                "was written") from None
    publish_dir(staging, out)
