"""`turnkeep bench all`: every benchmark, one after another, into one `--out`, then BENCHMARKS.md from that folder
alone, so every figure in it comes from one pass on one machine at one commit.

Each benchmark runs as its own `turnkeep bench <name>` process (its result records that exact command; one that
fails does not stop the others). The pass is sized for 2 cores: about two hours, most of it in the chaos runs of
`recovery`, `partial_turns` and `ranks`; a benchmark's own defaults measure longer (`turnkeep bench <name>`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from turnkeep.primitives.atomic_files import atomic_write_json

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
    "restart": ["--restarts", "3"],
    "learn": ["--steps", "100"],
    "learn_real": [],
    "lora": ["--rounds", "1", "--steps", "20"],
    "variants": ["--steps", "40"],
    "hangs": [],
    "replay": ["--kills", "4", "--steps", "30"],
    "peers": ["--steps", "30"],
}
"""Each benchmark's arguments in a pass (besides `--out`), in the order they run: `lower_bound`, `orchestration` and
`memory` read the runs `overhead` leaves in `--out`."""

PASS_FILE = "_pass.json"
"""What the pass itself records in `--out`: each benchmark's command, exit status, minutes and commit. A later
`--only` into the same `--out` (a benchmark that failed, or one fixed since) replaces its own entries only."""

PASS_SENTENCE = "The sections of "
"""How the head's sentence naming a pass begins (`pass_line`); `turnkeep bench markdown` from a folder that is no pass
keeps the previous file's."""

RUN_FOLDERS = {"overhead": "overhead", "wasted": "wasted", "recovery": "chaos", "soak": "soak", "engines": "engines",
               "partial_turns": "partial_turns", "ranks": "ranks",
               "restart": "restart", "learn": "learn", "learn_real": "learn_real", "lora": "lora", "variants": "variants", "hangs": "hangs",
               "replay": "replay", "peers": "peers"}
"""The folder of `--out` where each benchmark that starts runs keeps them (it refuses one that is not empty)."""

RunOne = Callable[[list[str]], int]
"""Runs one `turnkeep` command line (without `turnkeep`), returns its exit status."""


def bench_pass(out: Path, markdown: Path, only: list[str] | None = None, run_one: RunOne | None = None) -> int:
    """Run the pass (or the benchmarks `only`) into `out`; write `markdown` from `out` when every one succeeded. 0, or
    1 naming each benchmark that failed and the command that completes the pass."""
    run_one = run_one or _turnkeep
    names = only or list(PASS_ARGS)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    record = _read(out / PASS_FILE)  # a pass completed with --only keeps what the first one ran
    commit = _commit()
    for name in names:
        command = ["bench", name, "--out", str(out), *PASS_ARGS[name]]
        print(f"turnkeep bench all: {name}: turnkeep {' '.join(command)}", flush=True)
        _set_aside(out, name)
        began = time.monotonic()
        status = run_one(command)
        record["benchmarks"][name] = {"exit": status, "minutes": round((time.monotonic() - began) / 60, 1),
                                      "command": "turnkeep " + " ".join(command), "commit": commit,
                                      "finished_unix_s": round(time.time())}
        atomic_write_json(out / PASS_FILE, record)
        print(f"turnkeep bench all: {name}: exit {status} after {record['benchmarks'][name]['minutes']} min",
              flush=True)
    failed = [name for name in names if record["benchmarks"][name]["exit"] != 0]
    if failed:
        print(f"turnkeep bench all: {', '.join(failed)} failed (their logs are above); {markdown} was not written. "
              f"Complete the pass with `turnkeep bench all --out {out} --only {','.join(failed)}`", file=sys.stderr)
        return 1
    return run_one(["bench", "markdown", "--out", str(out), "--file", str(markdown)])


def pass_line(out: Path) -> str | None:
    """One sentence for BENCHMARKS.md's head naming the pass that wrote `out`, or None when no pass did."""
    record = _read(out / PASS_FILE)["benchmarks"]
    done = {name: record[name] for name in PASS_ARGS if name in record}  # the file keeps its keys sorted
    if not done:
        return None
    by_commit: dict[str, list[str]] = {}
    for name, each in done.items():
        by_commit.setdefault(each["commit"], []).append(name)
    commits = " and ".join(f"{commit} ({', '.join(names)})" for commit, names in by_commit.items())
    if len(by_commit) == 1:
        commits = next(iter(by_commit))
    minutes = sum(each["minutes"] for each in done.values())
    each = ", ".join(f"{name} {done[name]['minutes']}" for name in done)
    line = (f"{PASS_SENTENCE}{', '.join(done)} come from one pass, `turnkeep bench all`, at commit {commits}: "
            f"{minutes:.0f} minutes on the machine named under each table (minutes per benchmark: {each}).")
    failed = [name for name in done if done[name]["exit"] != 0]
    if failed:
        line += f" {', '.join(failed)} failed in that pass; their sections come from the command under each."
    return line


def _set_aside(out: Path, name: str) -> None:
    """Runs an earlier try of `name` left in `out` move to `out/set-aside/`, kept (never deleted), so the benchmark
    starts its runs afresh."""
    if name not in RUN_FOLDERS or not (folder := out / RUN_FOLDERS[name]).exists():
        return
    aside = out / "set-aside" / f"{folder.name}-{round(time.time())}"
    aside.parent.mkdir(exist_ok=True)
    folder.rename(aside)
    print(f"turnkeep bench all: {name}: the runs of an earlier try moved to {aside}", flush=True)


def _turnkeep(command: list[str]) -> int:
    return subprocess.run([sys.executable, "-m", "turnkeep", *command]).returncode


def _commit() -> str:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parents[1])
    return found.stdout.strip() if found.returncode == 0 else "unknown (not a git checkout)"


def _read(path: Path) -> dict:
    if not path.exists():
        return {"started_unix_s": round(time.time()), "benchmarks": {}}
    return orjson.loads(path.read_bytes())
