"""What every table of the config shares: unknown keys refused, a docstring per field, finite numbers only, and
paths that may not be empty."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict


def _path_given(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        raise ValueError('an empty path; give a path, or leave the key out for its default')
    return value


ConfigPath = Annotated[Path, BeforeValidator(_path_given)]
"""A path in the config: an empty string (which would mean the working directory) is refused."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True, allow_inf_nan=False)
