"""Load the run's TOML config into the pydantic tree, with errors a person can act on."""

from __future__ import annotations

import tomllib
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import orjson
from pydantic import BaseModel, ValidationError

from turnkeep.schemas.config import TurnkeepConfig


class ConfigError(ValueError):
    """The config cannot be used; the message names the key and what is allowed."""


def load_config(path: Path, overrides: dict[str, Any] | None = None) -> TurnkeepConfig:
    """Parse `path`, apply dotted `overrides` (`{"train.lr": 1e-4}`, as `--set` gives them), validate the tree."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; pass an existing TOML file (e.g. configs/tiny.toml)") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; pass a TOML file (e.g. configs/tiny.toml)") from None
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(f"config file {path} cannot be read ({reason}); pass a readable TOML file") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    for dotted, value in (overrides or {}).items():
        check_key_path(dotted)
        _set_dotted(raw, dotted, value, source=str(path))
    return parse_config(raw, source=str(path))


def parse_overrides(pairs: list[str]) -> dict:
    """`--set KEY=VALUE` flags as dotted overrides; load_config checks each key path against the config tree."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE, for example --set train.lr=1e-4")
        try:
            overrides[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            overrides[key] = value
    return overrides


def parse_config(raw: dict[str, Any], source: str = "config") -> TurnkeepConfig:
    try:
        return TurnkeepConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err, source)) from None


def check_key_path(dotted: str) -> None:
    """Raises ConfigError (one line) unless `dotted` names a key of the config tree (`--set KEY=VALUE`)."""
    parts = dotted.split(".")
    if not all(part.strip() for part in parts):
        raise ConfigError(f"--set {dotted!r}: a key path needs a name between every two dots, "
                          f"for example --set train.lr=1e-4")
    node: Any = TurnkeepConfig
    holder: type[BaseModel] | None = None  # the model whose field `node` is (None: an entry of a named table)
    for depth, key in enumerate(parts):
        if node is Any:
            return  # free-form options (`environments.<name>.options`): the environment's Options model checks them
        if _is_model(node):
            field = node.model_fields.get(key)
            if field is None:
                loc = ".".join(parts[: depth + 1])
                raise ConfigError(f"--set {dotted}: {_unknown_key(loc, sorted(node.model_fields))}")
            holder, node = node, _value_type(field.annotation)
        elif get_origin(node) is dict:
            holder, node = None, _value_type(get_args(node)[1]) if get_args(node) else Any
        else:
            value, table = ".".join(parts[:depth]), ".".join(parts[: depth - 1])
            siblings = "" if holder is None else \
                f", or use one of {table}'s keys: {', '.join(sorted(holder.model_fields))}"
            raise ConfigError(f"--set {dotted}: '{value}' is a single value, not a table, so it has no key {key!r}; "
                              f"set it with --set {value}=VALUE{siblings}")


def _unknown_key(loc: str, allowed: list[str]) -> str:
    return f"unknown key '{loc}': remove it or use one of: {', '.join(allowed)}"


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for depth, key in enumerate(parents):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            where = ".".join(parents[: depth + 1])
            raise ConfigError(f"--set {dotted}: '{where}' is already {node!r} (in {source} or an earlier --set), "
                              f"not a table; make it a table there, or set --set {where}=VALUE instead")
    node[leaf] = value


def _describe(err: ValidationError, source: str) -> str:
    lines = [f"{source}: {err.error_count()} problem(s) in the config; nothing was started."]
    for problem in err.errors():
        loc = ".".join(str(part) for part in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "finite_number":
            message = "inf and nan are not allowed; use a finite number"
        if problem["type"] == "extra_forbidden":
            lines.append(f"  {_unknown_key(loc, _allowed_keys(problem['loc'][:-1]))}")
        elif isinstance(problem.get("input"), dict):
            # A check of a whole table: the message names its settings; the table itself would be noise.
            lines.append(f"  {loc}: {message}" if loc else f"  {message}")
        else:
            lines.append(f"  {loc} = {problem.get('input')!r}: {message}")
    return "\n".join(lines)


def _allowed_keys(parent_loc: tuple[Any, ...]) -> list[str]:
    node: Any = TurnkeepConfig
    for part in parent_loc:
        if _is_model(node):
            field = node.model_fields.get(str(part))
            node = _value_type(field.annotation) if field else None
        elif get_origin(node) is dict:
            # A table of named entries (`[environments.<name>]`): this part is the entry's name.
            node = _value_type(get_args(node)[1]) if get_args(node) else None
        else:
            return []
    return sorted(node.model_fields) if _is_model(node) else []


def _value_type(annotation: Any) -> Any:
    """What a key holds, without `Annotated` metadata and without `| None` (an optional table is still a table)."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, types.UnionType):
        options = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(options) == 1:
            return _value_type(options[0])
    return annotation


def _is_model(node: Any) -> bool:
    return isinstance(node, type) and issubclass(node, BaseModel)
