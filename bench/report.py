"""What every benchmark returns, how its table looks, and the machine it ran on."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil


@dataclass
class BenchResult:
    name: str
    """Benchmark name (`overhead`, `wasted`, `scaling`, ...)."""
    table: str
    """The printed table (Markdown), as it goes into BENCHMARKS.md."""
    data: dict[str, Any] = field(default_factory=dict)
    """Every figure behind the table, machine-readable."""
    notes: list[str] = field(default_factory=list)
    """What limits each row, in words."""


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(), "os": platform.platform(),
    }


def write_result(out_dir: Path, result: BenchResult, command: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result.name}.json"
    payload = {"name": result.name, "command": command, "machine": machine(), "finished_unix_s": time.time(),
               "table": result.table, "notes": result.notes, "data": result.data}
    path.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return path
