"""`turnkeep bench engines`: what a second engine gives and costs on this machine.

Runs the default task with 1 and 2 engines in alternating pairs (same seed and length): rollout tokens/s, and the
refit (one serialization on the trainer, loaded into every engine at once) against copying the same bytes once in
memory, timed in this process right after each run. Then one more 2-engine run in which engine 1 is SIGKILLed from
outside after a few steps: the seconds from its death to its replacement taking turns, and whether the run lost a
step or retried a rollout for it.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import metric_lines, run_turnkeep, throughput
from turnkeep.primitives.pid_files import live_pid

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
KILL_AFTER_STEPS = 4
COPY_REPEATS = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=30, help="train steps of each run (default 30)")
    parser.add_argument("--pairs", type=int, default=2, help="alternating 1-engine / 2-engine pairs (default 2)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)


def memory_copy_s(size: int) -> float:
    """Median seconds to copy `size` bytes once in memory (the floor any weight transfer is measured against)."""
    source = os.urandom(min(size, 1 << 20)) * max(1, size // (1 << 20))
    times = []
    for _ in range(COPY_REPEATS):
        began = time.perf_counter()
        bytearray(source)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * size / max(len(source), 1)


def _refit(run_dir: Path) -> dict:
    steps = metric_lines(run_dir, "train_step")[1:]  # the first refit warms up the engines' load path
    size = int(statistics.median(s["refit_bytes"] for s in steps))
    return {"refit_s": round(statistics.median(s["refit_s"] for s in steps), 4), "refit_bytes": size,
            "copy_s": round(memory_copy_s(size), 5)}


def _pairs(args, common: list[str]) -> dict[str, dict]:
    runs = {}
    for pair in range(1, args.pairs + 1):
        order = [1, 2] if pair % 2 else [2, 1]
        for engines in order:
            run_dir = args.out / "engines" / f"e{engines}-{pair}"
            print(f"bench engines: pair {pair}, {engines} engine(s): {args.steps} steps in {run_dir}", flush=True)
            wall = run_turnkeep(run_dir, args.config, args.steps, [*common, f"policy.engines={engines}"],
                                run_dir.parent / f"{run_dir.name}.log")
            runs[f"{engines} engine(s) #{pair}"] = {**throughput(run_dir), **_refit(run_dir), "engines": engines,
                                                    "pair": pair, "wall_s": round(wall, 1), "run_dir": str(run_dir)}
    return runs


def _death(args, common: list[str]) -> dict:
    """A 2-engine run; engine 1 SIGKILLed after `KILL_AFTER_STEPS` steps; what the replacement took."""
    run_dir = args.out / "engines" / "death"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise SystemExit(f"{run_dir} is not empty; benchmarks start new runs (pick another --out)")
    log = run_dir.parent / "death.log"
    command = [sys.executable, "-m", "turnkeep", "run", "--config", str(args.config), "--run-dir", str(run_dir),
               "--steps", str(args.steps)]
    for setting in [*common, "policy.engines=2"]:
        command += ["--set", setting]
    print(f"bench engines: engine 1 killed after {KILL_AFTER_STEPS} steps in {run_dir}", flush=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not _steps(run_dir) >= KILL_AFTER_STEPS:
            if proc.poll() is not None:
                raise SystemExit(f"the run in {run_dir} exited {proc.returncode} before the kill; see {log}")
            time.sleep(0.2)
        steps_at_kill = _steps(run_dir)
        os.kill(live_pid(run_dir, "policy.1"), signal.SIGKILL)
        code = proc.wait(timeout=3600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if code != 0:
        raise SystemExit(f"the run in {run_dir} exited {code} after engine 1 was killed; see {log}")
    restarts = metric_lines(run_dir, "engine_restart")
    last = metric_lines(run_dir, "train_step")[-1]
    return {"steps_at_kill": steps_at_kill, "replacement_s": restarts[0]["seconds"] if restarts else None,
            "restarts": len(restarts), "steps": last["step"], "retries_total": last["retries_total"],
            "run_dir": str(run_dir)}


def _steps(run_dir: Path) -> int:
    return len(metric_lines(run_dir, "train_step")) if (run_dir / "metrics.jsonl").exists() else 0


def run(args: argparse.Namespace) -> BenchResult:
    if args.pairs < 1 or args.steps < 2 * KILL_AFTER_STEPS:
        raise SystemExit(f"bench engines: --pairs at least 1 and --steps at least {2 * KILL_AFTER_STEPS}")
    common = [*args.set, "temporal.port=0", "temporal.ui_port=0"]
    runs = _pairs(args, common)
    death = _death(args, common)
    return _report(args, runs, death)


def _median(runs: dict[str, dict], engines: int, key: str) -> float:
    return statistics.median(r[key] for r in runs.values() if r["engines"] == engines)


def _report(args, runs: dict[str, dict], death: dict) -> BenchResult:
    rows = [[name, r["rollout_tokens_per_s"], r["train_steps_per_min"], r["refit_s"] * 1000, r["refit_bytes"] / 1e6,
             round(r["copy_s"] * 1000, 3), round(r["refit_s"] / max(r["copy_s"], 1e-9))] for name, r in runs.items()]
    summary = {n: {key: _median(runs, n, key) for key in ("rollout_tokens_per_s", "refit_s", "copy_s")}
               for n in (1, 2)}
    speedup = summary[2]["rollout_tokens_per_s"] / summary[1]["rollout_tokens_per_s"]
    table = markdown_table(["run", "rollout tok/s", "train steps/min", "refit ms (median)", "refit MB",
                            "one memory copy ms", "refit / copy"], rows)
    notes = [
        f"2 engines / 1 engine rollout tokens/s: {speedup:.2f} (median of {args.pairs} alternating pairs, "
        f"{args.steps} steps a run). On 2 cores both engines share the CPUs with the trainer and the environment "
        "server, so a second engine cannot add generation here; what it gives needs a machine with a GPU per engine "
        "and vLLM (the lent GPU machine has no vLLM).",
        f"Refit into 1 engine {summary[1]['refit_s']:.3f} s, into 2 engines {summary[2]['refit_s']:.3f} s "
        "(median step; the weights are serialized once and both engines load the one Ray object at once); one "
        f"in-memory copy of the same bytes {summary[1]['copy_s'] * 1000:.2f} ms.",
        f"Engine 1 SIGKILLed after step {death['steps_at_kill']}: its replacement took turns "
        f"{death['replacement_s']:.1f} s after the death (vLLM's start on a CPU shared with the run); the run reached step {death['steps']} with "
        f"retries_total {death['retries_total']} (its interrupted turns went to engine 0 inside their policy "
        "calls).",
    ]
    return BenchResult("engines", table, {"runs": runs, "summary": summary, "speedup": round(speedup, 3),
                                          "death": death}, notes)
