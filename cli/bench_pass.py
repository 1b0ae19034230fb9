"""`turnkeep bench all`: every benchmark, one after another, into one `--out`, then BENCHMARKS.md from that folder
alone, so every figure in it comes from one pass on one machine at one commit.

Each benchmark runs as its own `turnkeep bench <name>` process (its result records that exact command; one that
fails does not stop the others). The pass is sized for 2 cores: about 90 minutes, most of it in the chaos runs of
`recovery`, `partial_turns` and `ranks`; a benchmark's own defaults measure longer (`turnkeep bench <name>`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

PASS_ARGS: dict[str, list[str]] = {
    "overhead": ["--pairs", "2", "--steps", "40", "--agents", "parked,journal"],
    "wasted": ["--steps", "40"],
    "lower_bound": [],
    "orchestration": [],
    "scaling": ["--agents", "10,10000", "--rows", "1000,100000,1000000"],
    "recovery": ["--kills", "10"],
    "memory": [],
    "fanout": ["--repeats", "3"],
    "soak": ["--attempts", "300", "--timeout-s", "900"],
    "engines": ["--pairs", "1"],
    "partial_turns": ["--kills", "8", "--chaos-steps", "70", "--pairs", "2", "--steps", "25"],
    "journal_cost": ["--pairs", "4"],
    "ranks": ["--kills", "2", "--chaos-steps", "60"],
}
"""Each benchmark's arguments in a pass (besides `--out`), in the order they run: `lower_bound`, `orchestration` and
`memory` read the runs `overhead` leaves in `--out`."""

PASS_FILE = "_pass.json"
"""What the pass itself records in `--out`: commit, start, and each benchmark's exit status and minutes."""

RunOne = Callable[[list[str]], int]
"""Runs one `turnkeep` command line (without `turnkeep`), returns its exit status."""


def bench_pass(out: Path, markdown: Path, only: list[str] | None = None, run_one: RunOne | None = None) -> int:
    """Run the pass into `out`; write `markdown` from `out` when every benchmark succeeded. 0, or 1 naming each
    benchmark that failed and the command that completes the pass."""
    run_one = run_one or _turnkeep
    names = only or list(PASS_ARGS)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    record = {"commit": _commit(), "started_unix_s": round(time.time()), "benchmarks": {}}
    for name in names:
        command = ["bench", name, "--out", str(out), *PASS_ARGS[name]]
        print(f"turnkeep bench all: {name}: turnkeep {' '.join(command)}", flush=True)
        began = time.monotonic()
        status = run_one(command)
        record["benchmarks"][name] = {"exit": status, "minutes": round((time.monotonic() - began) / 60, 1),
                                      "command": "turnkeep " + " ".join(command)}
        _write(out / PASS_FILE, record)
        print(f"turnkeep bench all: {name}: exit {status} after {record['benchmarks'][name]['minutes']} min",
              flush=True)
    failed = [name for name, done in record["benchmarks"].items() if done["exit"] != 0]
    if failed:
        again = "; ".join(record["benchmarks"][name]["command"] for name in failed)
        print(f"turnkeep bench all: {', '.join(failed)} failed (their logs are above); {markdown} was not written. "
              f"Run {again}, then `turnkeep bench markdown --out {out}`", file=sys.stderr)
        return 1
    return _turnkeep_markdown(out, markdown, run_one)


def pass_line(out: Path) -> str | None:
    """One sentence for BENCHMARKS.md's head naming the pass that wrote `out`, or None when no pass did."""
    path = out / PASS_FILE
    if not path.exists():
        return None
    record = orjson.loads(path.read_bytes())
    done = record["benchmarks"]
    minutes = sum(each["minutes"] for each in done.values())
    each = ", ".join(f"{name} {done[name]['minutes']}" for name in done)
    line = (f"The sections of {', '.join(done)} come from one pass, `turnkeep bench all`, at commit "
            f"{record['commit']}: {minutes:.0f} minutes on the machine named under each table (minutes per "
            f"benchmark: {each}).")
    failed = [name for name in done if done[name]["exit"] != 0]
    if failed:
        line += f" {', '.join(failed)} failed in that pass; their sections come from the command under each."
    return line


def _turnkeep_markdown(out: Path, markdown: Path, run_one: RunOne) -> int:
    return run_one(["bench", "markdown", "--out", str(out), "--file", str(markdown)])


def _turnkeep(command: list[str]) -> int:
    return subprocess.run([sys.executable, "-m", "cli.main", *command]).returncode


def _commit() -> str:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parents[1])
    return found.stdout.strip() if found.returncode == 0 else "unknown (not a git checkout)"


def _write(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    tmp.replace(path)
