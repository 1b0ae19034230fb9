"""What every table of the config shares: unknown keys refused, a docstring per field, finite numbers only, and
paths that may not be empty (a model's path may be a Hugging Face hub id instead)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Tag


def _path_given(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        raise ValueError('an empty path; give a path, or leave the key out for its default')
    return value


ConfigPath = Annotated[Path, BeforeValidator(_path_given)]
"""A path in the config: an empty string (which would mean the working directory) is refused."""

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
"""`org/name`, as the Hugging Face hub spells a repository."""


def is_hub_id(text: str) -> bool:
    """`org/name` naming no local file or folder. What looks like a folder (absolute, starting with . or ~, more
    than one /), a GGUF file, or exists here is a path."""
    return (HUB_ID.fullmatch(text) is not None and not text.lower().endswith(".gguf")
            and not Path(text).exists())


def _model_source(value: Any) -> str:
    return "hub" if isinstance(value, str) and is_hub_id(value) else "folder"


ModelPath = Annotated[Annotated[Path, Tag("folder")] | Annotated[str, Tag("hub")], Discriminator(_model_source),
                      BeforeValidator(_path_given)]
"""A model folder (a Path, as ConfigPath gives it) or a Hugging Face hub id (a str, resolved to a folder before the
run starts: `workers/model_source.py`)."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True, allow_inf_nan=False)
