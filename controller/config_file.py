"""Load the run's TOML config into the pydantic tree, with errors a person can act on."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from schemas.config import TurnkeepConfig


class ConfigError(ValueError):
    """The config cannot be used; the message names the key and what is allowed."""


def load_config(path: Path, overrides: dict[str, Any] | None = None) -> TurnkeepConfig:
    """Parse `path`, apply dotted `overrides` (`{"train.lr": 1e-4}`), validate the tree."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; pass an existing TOML file (e.g. configs/tiny.toml)") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    return parse_config(raw, source=str(path))


def parse_config(raw: dict[str, Any], source: str = "config") -> TurnkeepConfig:
    try:
        return TurnkeepConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err, source)) from None


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _describe(err: ValidationError, source: str) -> str:
    lines = [f"{source}: {err.error_count()} problem(s) in the config; nothing was started."]
    for problem in err.errors():
        loc = ".".join(str(part) for part in problem["loc"])
        if problem["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed_keys(problem["loc"][:-1]))
            lines.append(f"  unknown key '{loc}': remove it or use one of: {allowed}")
        else:
            lines.append(f"  {loc} = {problem.get('input')!r}: {problem['msg']}")
    return "\n".join(lines)


def _allowed_keys(parent_loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = TurnkeepConfig
    parts = list(parent_loc)
    while parts:
        field = model.model_fields.get(str(parts.pop(0)))
        annotation = field.annotation if field else None
        if get_origin(annotation) is dict:
            # A table of named entries (`[environments.<name>]`): the next part is the entry's name.
            annotation = get_args(annotation)[1]
            if parts:
                parts.pop(0)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)
