"""The base of every message that crosses a process boundary or enters workflow history."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Wire(BaseModel):
    """Unknown fields are refused, so a message from a newer or foreign sender fails loudly; so are
    infinite and NaN numbers, which no field means (an infinite lease would never expire)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)
