"""`turnkeep config-docs`: every config key with its type, default and docstring, generated from `schemas/config.py`
into `docs/config.md` (`--check` fails when the file is not what the schema gives, so the reference cannot drift)."""

from __future__ import annotations

import argparse
import enum
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from turnkeep.schemas.config import TurnkeepConfig

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "config.md"
HEADER = """# Configuration reference

Generated from `schemas/config.py` by `turnkeep config-docs`; do not edit by hand. Every key goes in the TOML file
(`[section]` then `key = value`) or on the command line (`--set section.key=value`). An unknown key or a bad value
stops the run before anything starts, naming the key.
"""


def add_config_docs_parser(subparsers) -> argparse.ArgumentParser:
    docs = subparsers.add_parser("config-docs", help="write the config reference (docs/config.md) from the schema")
    docs.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write it (default: docs/config.md)")
    docs.add_argument("--check", action="store_true", help="write nothing; exit 1 if --out differs from the schema")
    return docs


def run_config_docs(args: argparse.Namespace) -> int:
    text = config_reference()
    if args.check:
        try:
            current = args.out.read_text()
        except OSError as err:
            print(f"turnkeep: {args.out} cannot be read ({err.strerror}); run `turnkeep config-docs`", file=sys.stderr)
            return 1
        if current != text:
            print(f"turnkeep: {args.out} is not what schemas/config.py gives; run `turnkeep config-docs`",
                  file=sys.stderr)
            return 1
        print(f"turnkeep: {args.out} is up to date")
        return 0
    if not args.out.parent.is_dir():
        print(f"turnkeep: --out {args.out}: no folder {args.out.parent}; make it or pick another path",
              file=sys.stderr)
        return 2
    args.out.write_text(text)
    print(f"turnkeep: wrote {args.out} ({text.count(chr(10) + '| `')} keys)")
    return 0


def config_reference() -> str:
    parts = [HEADER]
    for name, field in TurnkeepConfig.model_fields.items():
        model, prefix = _section_model(field.annotation), name
        if model is None:
            continue
        if typing.get_origin(field.annotation) is dict:
            prefix = f"{name}.<name>"
        parts.append(f"\n## `[{prefix}]`\n\n{_one_line(field.description)}\n\n| key | type | default | what |\n"
                     "| --- | --- | --- | --- |\n")
        parts += [_row(key, sub) for key, sub in _leaves(model, "")]
    return "".join(parts)


def _section_model(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) is dict:
        value = typing.get_args(annotation)[1]
        return value if isinstance(value, type) and issubclass(value, BaseModel) else None
    return None


def _leaves(model: type[BaseModel], prefix: str) -> list[tuple[str, FieldInfo]]:
    rows = []
    for name, field in model.model_fields.items():
        nested = field.annotation if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) \
            else None
        if nested is not None:
            rows += _leaves(nested, f"{prefix}{name}.")
        else:
            rows.append((f"{prefix}{name}", field))
    return rows


def _row(key: str, field: FieldInfo) -> str:
    return (f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | "
            f"{_one_line(field.description).replace('|', '&#124;')} |\n")


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " / ".join(f'`"{value}"`' for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin in (list, dict, tuple):
        return f"{origin.__name__} of " + ", ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return "none"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " / ".join(f'`"{member.value}"`' for member in annotation)
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "PosixPath": "path",
                "Path": "path", "Any": "any"}.get(annotation.__name__, annotation.__name__)
    return str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, BaseModel):
        return "(table)"
    if isinstance(value, Path):
        value = str(value)
    text = repr(value) if not isinstance(value, bool) else str(value).lower()
    return f"`{text}`" if len(text) <= 40 else f"`{text[:37]}...`"


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())
