"""Prompts from a file (`[data] train`): `.jsonl` (one JSON object per line) or `.parquet`.

A record has `prompt` (required, non-empty text the environment shows; it becomes
`Problem.question`), optional `answer` (a number, a string or null), optional `env` (the
name of an `[environments]` entry; absent or null: the dataloader picks one by weight) and any
other fields, which reach the environment as `Problem.metadata`.

The whole file is checked before anything starts, so a bad record stops the run with one
line naming the file, the line (or parquet row), what is wrong and how to fix it, instead
of failing hours later when the dataloader reaches it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from turnkeep.config.loader import ConfigError
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.rollout import PromptRecord

PROMPT_FILE_SUFFIXES = (".jsonl", ".parquet")
_RESERVED_FIELDS = ("prompt", "answer", "env")


class PromptFileError(ConfigError):
    """A prompts file that cannot be used; the one-line message names the file, the line or row, and the fix."""


def load_prompt_file(path: Path, env_names: Collection[str]) -> list[PromptRecord]:
    """Read and check every record of `path`; `env_names` are the run's configured environments.

    Raises `PromptFileError` on the first problem: a missing file, an unknown extension,
    an empty file, or a record that is not usable.
    """
    path = Path(path)
    _check_file_exists(path)
    if path.suffix == ".jsonl":
        rows = _jsonl_rows(path)
    elif path.suffix == ".parquet":
        rows = _parquet_rows(path)
    else:
        raise PromptFileError(f"{path}: unknown prompts file type {path.suffix or '(no extension)'!r}; "
                              f"use one of {', '.join(PROMPT_FILE_SUFFIXES)} (data.train)")
    records = [_check_record(fields, where, env_names) for where, fields in rows]
    if not records:
        raise PromptFileError(f"{path}: the prompts file holds no records; add at least one "
                              '{"prompt": "..."} record or unset data.train to use generated problems')
    return records


def records_digest(records: list[PromptRecord]) -> str:
    """sha256 of the records in canonical JSON: the same prompts give the same digest whatever the file format."""
    canonical = json.dumps([record.model_dump() for record in records], sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class PromptFile:
    """A prompts file as the dataloader's prompt source: its checked records, one pass after another."""

    def __init__(self, path: Path, env_names: Collection[str]) -> None:
        self.path = Path(path)
        self._records = load_prompt_file(self.path, env_names)
        self.digest = records_digest(self._records)

    @property
    def size(self) -> int:
        return len(self._records)

    def record(self, position: int) -> PromptRecord:
        return self._records[position]


def check_prompt_file(cfg: TurnkeepConfig) -> None:
    """Start-up check: the configured prompts file (if any) is readable and every record usable."""
    if cfg.data.train is not None:
        load_prompt_file(cfg.data.train, env_names=cfg.environments.keys())


def _check_file_exists(path: Path) -> None:
    if not path.exists():
        raise PromptFileError(f"{path}: prompts file does not exist (data.train); fix the path (a relative path "
                              f"is relative to the working directory, {Path.cwd()})")
    if not path.is_file():
        raise PromptFileError(f"{path}: prompts file is not a regular file (data.train); point it at a "
                              f"{' or '.join(PROMPT_FILE_SUFFIXES)} file")


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(`<file> line N`, parsed value) per non-blank line; line numbers count the blank lines too."""
    # Split on "\n" only: JSON text never holds a raw newline, but may hold other characters
    # that str.splitlines() would treat as line ends (U+2028), which would shift the line numbers.
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        where = f"{path} line {number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise PromptFileError(f"{where}: not UTF-8 text (byte {err.start + 1}); save the file as UTF-8") from None
        if not text.strip():
            continue
        try:
            yield where, json.loads(text)
        except json.JSONDecodeError as err:
            raise PromptFileError(f"{where}: not valid JSON ({err.msg} at column {err.colno}); write one JSON "
                                  'object per line, e.g. {"prompt": "...", "answer": 42}') from None


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(`<file> row N`, the row's fields) per row; a null cell counts as an absent field (columns are shared)."""
    import pyarrow  # imported here: only runs that read parquet pay for it
    import pyarrow.parquet

    try:
        table = pyarrow.parquet.read_table(path)
    except (pyarrow.ArrowException, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise PromptFileError(f"{path}: not a readable parquet file ({reason}); write it with pyarrow or pandas "
                              "(DataFrame.to_parquet), or use .jsonl") from None
    for number, row in enumerate(table.to_pylist(), start=1):
        yield f"{path} row {number}", {key: value for key, value in row.items() if value is not None}


def _check_record(fields: Any, where: str, env_names: Collection[str]) -> PromptRecord:
    if not isinstance(fields, dict):
        raise PromptFileError(f"{where}: {_json_kind(fields)}, not an object; write each prompt as "
                              '{"prompt": "...", "answer": ...}')
    if "prompt" not in fields:
        raise PromptFileError(f'{where}: no "prompt" field; add "prompt": "<the text the environment shows>"')
    prompt = fields["prompt"]
    if not isinstance(prompt, str):
        raise PromptFileError(f'{where}: "prompt" is {_json_kind(prompt)}, not a string; write the prompt as text')
    if not prompt.strip():
        raise PromptFileError(f'{where}: "prompt" is empty; give the text the environment shows, or remove the record')
    answer = fields.get("answer")
    if isinstance(answer, bool) or not isinstance(answer, int | float | str | None):
        raise PromptFileError(f'{where}: "answer" is {_json_kind(answer)}; use a number, a string or null '
                              "(extra structure belongs in other fields, which reach the environment as metadata)")
    env = fields.get("env")
    if env is not None:
        _check_env(env, where, env_names)
    metadata = {key: value for key, value in fields.items() if key not in _RESERVED_FIELDS}
    _check_json_able(metadata, answer, where)
    return PromptRecord(prompt=prompt, answer=answer, env=env, metadata=metadata)


def _check_env(env: Any, where: str, env_names: Collection[str]) -> None:
    configured = ", ".join(sorted(env_names))
    if not isinstance(env, str):
        raise PromptFileError(f'{where}: "env" is {_json_kind(env)}; name one of the run\'s environments '
                              f"({configured}) as a string, or leave it out to pick one by weight")
    if env not in env_names:
        raise PromptFileError(f'{where}: "env" = {_short(env)} is not in [environments] (configured: {configured}); '
                              f"use one of those or add [environments.{env}] to the config")


def _check_json_able(metadata: dict[str, Any], answer: Any, where: str) -> None:
    # Problems travel as JSON to the environment servers and into checkpoints: a parquet
    # timestamp or bytes cell, or a NaN, would fail there instead of here.
    for key, value in [("answer", answer), *metadata.items()]:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise PromptFileError(f"{where}: field {_short(key)} holds {_short(value)} ({type(value).__name__}), "
                                  "which is not JSON-able; store it as a string or a finite number") from None


def _json_kind(value: Any) -> str:
    """What a value is in JSON terms, with its article: "an array", "a number", "null"."""
    kinds = {dict: "a JSON object", list: "a JSON array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _short(value: Any, limit: int = 40) -> str:
    """repr() keeps the message on one line (newlines are escaped); long values are cut."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
