"""`turnkeep bench learn`: the `tool_chat` task on the made-up tiny chat model, start to finish on this machine.

One `turnkeep run` of `configs/tool_chat.toml` (a reasoning-gym task in the `<tool_call>` format, the tiny model
warm-started on the environment's demonstrations, half of them wrong): its reward curve (the mean of each tenth of
the steps; first ten steps against the last ten), wall time, rollout tokens/s and train steps/min. Then the newest
checkpoint is exported (`turnkeep export`: bytes, seconds) and both the base model and the export are scored on the
task's held-out problems (`turnkeep eval`: pass@k, mean reward), so the gain is measured on problems it never
trained on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import metric_lines, run_turnkeep, throughput

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tool_chat.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--steps", type=int, default=100, help="train steps (default 100)")
    parser.add_argument("--eval-prompts", type=int, default=50, help="held-out problems scored (default 50)")
    parser.add_argument("--samples", type=int, default=4, help="samples per held-out problem (default 4)")


def run(args: argparse.Namespace) -> BenchResult:
    base = (args.out / "learn").resolve()
    config = args.config.resolve()
    run_dir = base / "run"
    wall = run_turnkeep(run_dir, config, args.steps, args.set, base / "run.log")
    figures = {**throughput(run_dir), "wall_s": round(wall, 1), "curve": _curve(run_dir)}
    settings = [arg for pair in args.set for arg in ("--set", pair)]
    base_model = _turnkeep(["make-model", "--config", str(config), *settings], base / "make-model.log").split()[-1]
    exported = base / "export"
    started = time.monotonic()
    export_line = _turnkeep(["export", "--run-dir", str(run_dir), "--out", str(exported)], base / "export.log")
    figures["export"] = {"seconds": round(time.monotonic() - started, 1), "line": export_line.strip().splitlines()[-1],
                         "bytes": sum(p.stat().st_size for p in exported.rglob("*") if p.is_file())}
    figures["eval"] = {name: _eval(model, config, settings, args, base / f"eval-{name}.json")
                       for name, model in (("base", base_model), ("trained", str(exported)))}
    return BenchResult("learn", _table(figures), figures, _notes(figures, args))


def _curve(run_dir: Path) -> list[float]:
    rewards = [s["reward_mean"] for s in metric_lines(run_dir, "train_step")]
    tenth = max(1, len(rewards) // 10)
    return [round(statistics.fmean(rewards[i:i + tenth]), 3) for i in range(0, tenth * 10, tenth)
            if rewards[i:i + tenth]]


def _eval(model: str, config: Path, settings: list[str], args: argparse.Namespace, out: Path) -> dict:
    _turnkeep(["eval", "--model", model, "--config", str(config), *settings, "--samples", str(args.samples),
               "--limit", str(args.eval_prompts), "--out", str(out)], out.with_suffix(".log"))
    return json.loads(out.read_text())


def _turnkeep(command: list[str], log: Path) -> str:
    """One `turnkeep` command to its end; its output (kept in `log`); its failure ends the benchmark with the tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "turnkeep", *command], capture_output=True, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"turnkeep {command[0]} exited {done.returncode}; the end of {log}:\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def _table(figures: dict) -> str:
    rows = [["training", f"{figures['reward_first10']:.3f} -> {figures['reward_last10']:.3f}",
             " ".join(f"{r:.2f}" for r in figures["curve"]), figures["steps"], figures["wall_s"],
             figures["rollout_tokens_per_s"], figures["train_steps_per_min"]]]
    for name, result in figures["eval"].items():
        passes = ", ".join(f"pass@{k} {v:.3f}" for k, v in result["pass_at"].items())
        rows.append([f"held-out, {name} model", f"{result['mean_reward']:.3f}", passes, result["prompts"],
                     round(result["seconds"], 1), "", ""])
    return markdown_table(["what", "reward", "curve (tenths) / pass@k", "steps / prompts", "seconds", "tokens/s",
                           "steps/min"], rows)


def _notes(figures: dict, args: argparse.Namespace) -> list[str]:
    export = figures["export"]
    return [f"reward of the first ten train steps against the last ten; the curve is the mean of each tenth of the "
            f"{figures['steps']} steps",
            f"held-out: {args.eval_prompts} problems the run never trained on, {args.samples} samples each, "
            "temperature 1; a sample is correct at reward 1",
            f"export of the newest checkpoint: {export['bytes']:,} bytes in {export['seconds']} s "
            f"({export['line']})"]
