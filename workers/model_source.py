"""`model.path` given as a Hugging Face hub id (`org/name`, at `model.revision`): resolved once, in the controller
before anything starts, to its folder in the Hugging Face cache, so the run's config (and its `config.json`, which
every later process and incarnation reads) names that folder.

The cache is huggingface_hub's own, read at call time: HF_HUB_CACHE, else HF_HOME/hub; HF_HUB_OFFLINE (or
TRANSFORMERS_OFFLINE) looks only there, and the token is the usual one (HF_TOKEN, or the one `hf auth login` saved).
Online, a model that is not cached yet is fetched into the cache (its weights, config and tokenizer files). A hub id
that cannot be had is one line naming it and the command that fetches it.

A `.gguf` file, or the name of a model that ships in a package (`packaged_models.py`), becomes its converted folder
the same way (`gguf_model.py`), in `model.cache_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path

from turnkeep.config.loader import ConfigError
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.gguf_model import gguf_model_folder, is_gguf_file
from turnkeep.workers.packaged_models import is_packaged_name, packaged_gguf

MODEL_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
"""What a run reads of a hub repository: config, weights (safetensors), tokenizer and chat template files; the same
weights in other formats (.bin, .gguf, .onnx, ...) are not fetched."""

TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
"""How huggingface_hub reads a yes in an environment variable."""


def with_model_resolved(cfg: TurnkeepConfig) -> TurnkeepConfig:
    """`cfg` with a hub id, a GGUF file or a packaged model's name in `model.path` (and in
    `algorithm.reference_path`) replaced by its folder; unchanged when each is a folder or unset. Raises ConfigError
    (one line) when a model cannot be had."""
    cache = Path(cfg.model.cache_dir)
    path, reference = cfg.model.path, cfg.algorithm.reference_path
    if path is not None and (folder := model_folder(path, cfg.model.revision, cache)) != path:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": folder})})
    key = "algorithm.reference_path"
    if reference is not None and (folder := model_folder(reference, None, cache, key)) != reference:
        cfg = cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(update={"reference_path": folder})})
    return cfg


def model_folder(source: Path | str, revision: str | None, cache: Path, key: str = "model.path") -> Path:
    """The local folder of a model source: a hub id's cached snapshot, a GGUF file's or a packaged model's
    converted folder, or the folder itself."""
    if isinstance(source, str):
        return hub_folder(source, revision, key)
    if is_packaged_name(str(source)):
        return gguf_model_folder(packaged_gguf(str(source), key), cache, key)
    if is_gguf_file(source):
        return gguf_model_folder(source.expanduser(), cache, key)
    return source


def hub_folder(repo_id: str, revision: str | None, key: str = "model.path") -> Path:
    """The cached snapshot folder of `repo_id` at `revision` (fetched first when online and missing); errors name
    the config `key` that gave it."""
    try:
        # A late import: huggingface_hub comes with the trainer's extra, and only a hub id needs it.
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HFValidationError,
            IncompleteSnapshotError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise ConfigError(f"{key} = {repo_id!r} is a Hugging Face hub id, and huggingface_hub is not installed; "
                          f"install turnkeep[cpu] or turnkeep[gpu], or set {key} to a local folder") from None
    cache, offline = hub_cache_dir(), hub_offline()
    fix = f"fetch it with `{fetch_command(repo_id, revision)}`, or set {key} to a local folder"
    named = f"{key} = {repo_id!r}" + ("" if revision is None else f" (model.revision = {revision!r})")
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=offline,
                                      allow_patterns=MODEL_FILES))
    except HFValidationError:
        raise ConfigError(f"{named} is not a valid Hugging Face hub id (org/name); set {key} to a local "
                          "folder or a hub id") from None
    except RevisionNotFoundError:
        raise ConfigError(f"{named}: the hub has no revision {revision!r} of {repo_id}; set model.revision to a "
                          "branch, tag or commit of it (or remove it for the default branch)") from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise ConfigError(f"{named}: the Hugging Face hub has no model {repo_id} that this machine may read (a "
                          f"private or gated one needs a token: `hf auth login`); {fix}") from None
    except IncompleteSnapshotError:
        raise ConfigError(f"{named}: its copy in the Hugging Face cache ({cache}) is incomplete and the hub cannot "
                          f"be reached to complete it; {fix}") from None
    except LocalEntryNotFoundError as err:
        why = "HF_HUB_OFFLINE is set" if offline else f"the hub could not be reached ({_reason(err)})"
        raise ConfigError(f"{named} is not in the Hugging Face cache ({cache}) and {why}; {fix}") from None
    except Exception as err:  # the hub answered with an error, a proxy refused, the cache cannot be written
        if not isinstance(err, OSError) and not type(err).__module__.startswith(("huggingface_hub", "httpx")):
            raise
        raise ConfigError(f"{named}: it could not be had from the Hugging Face hub ({_reason(err)}); {fix}") from None


def fetch_command(repo_id: str, revision: str | None) -> str:
    """The command of huggingface_hub's CLI that puts `repo_id` into the cache."""
    return f"hf download {repo_id}" + ("" if revision is None else f" --revision {revision}")


def hub_cache_dir() -> Path:
    """huggingface_hub's cache folder as the environment names it now (the library reads it once, at import)."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def hub_offline() -> bool:
    """Whether the environment says to look in the cache only (HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in TRUE_VALUES


def _reason(err: BaseException) -> str:
    """The root cause's first line, so the refusal stays one line."""
    while err.__cause__ is not None:
        err = err.__cause__
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first}" if first else type(err).__name__
