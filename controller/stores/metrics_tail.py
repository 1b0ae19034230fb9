"""The lines appended to `metrics.jsonl` since a mirror last looked, each taken exactly once across restarts: how
far the mirror got is kept in an offset file of its own (`<mirror dir>/mirrored_offset`), moved on only after the
mirror wrote what it read. A torn last line waits for its end."""

from __future__ import annotations

from pathlib import Path

import orjson

from turnkeep.primitives.atomic_files import atomic_write_text

OFFSET_FILE = "mirrored_offset"


class MetricsTail:
    def __init__(self, run_dir: Path, mirror_dir: Path) -> None:
        self._metrics = Path(run_dir) / "metrics.jsonl"
        self._offset_file = Path(mirror_dir) / OFFSET_FILE
        self._offset = _read_offset(self._offset_file)
        self._pending = 0

    def read_new(self) -> list[dict]:
        """The complete lines after the kept offset, parsed (a line that is not a JSON object is skipped)."""
        try:
            with self._metrics.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self._pending = end
        records = []
        for line in data[:end].splitlines():
            try:
                record = orjson.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def commit(self) -> None:
        """What `read_new` returned has been written by the mirror: the next start goes on after it."""
        if self._pending:
            self._offset += self._pending
            self._pending = 0
            atomic_write_text(self._offset_file, str(self._offset))


def numbers(record: dict, prefix: str = "") -> list[tuple[str, float]]:
    """Every number in a line, nested dicts flattened (`groups_discarded_total/stale`); booleans left out."""
    found = []
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            found.append((name, float(value)))
        elif isinstance(value, dict):
            found += numbers(value, f"{name}/")
    return found


def _read_offset(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0
