"""`turnkeep bench peers`: turnkeep against TRL's GRPOTrainer on the same tiny chat model, the same single-turn task
and prompts (the `tool_chat` task without tools: one turn, answered in `<answer>` tags), the same group size, batch,
learning rate, loss (token mean, advantages scaled by the group's std) and temperature, on this machine. The task's
problems are sums of two one-digit numbers: without its calculator the tiny model can learn those, not longer ones.

Per pair (the order alternates between pairs, so a drift of the machine's speed falls on both): an uninterrupted
run of each (wall time from the command to a fixed reward, the reward at a fixed wall time, generated tokens/s, train
steps/min, peak memory), then a run of each SIGKILLed after half its steps and started again by its own resume path
(turnkeep: the same command; TRL: `resume_from_checkpoint`): the train steps the kill undid and the seconds from the
restart to the next train step. TRL runs in its own process (`bench/peers_trl.py`); its exact version is recorded."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from turnkeep.bench.peers_figures import side_figures, target_reward
from turnkeep.bench.peers_report import report
from turnkeep.bench.report import BenchResult
from turnkeep.bench.runs import metric_lines, turnkeep_output
from turnkeep.chaos.targets import kill_everything
from turnkeep.config.loader import load_config, parse_overrides

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tool_chat.toml"
TASK = "environments.math.options.reasoning_gym.config.basic_arithmetic"
SINGLE_TURN = ["environments.math.options.tools=[]", "environments.math.options.max_tool_calls=0",
               f"{TASK}.max_terms=2", f"{TASK}.max_digits=1", f'{TASK}.operators=["+"]',
               "rollout.max_turns=1", "eval.every_steps=0", "eval.before_training=false", "train.passes_per_batch=1",
               "algorithm.advantage=grpo", "algorithm.scale_rewards=group", "algorithm.loss_agg=token_mean"]
"""The task without tools, on sums of two one-digit numbers (what a two-layer model can learn to answer without a
calculator), and the loss TRL's default (`loss_type = "dapo"`, `scale_rewards = "group"`) computes."""
POLL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=40, help="train steps of each run (default 40)")
    parser.add_argument("--pairs", type=int, default=1, help="pairs of runs of each framework (default 1)")
    parser.add_argument("--save-steps", type=int, default=5, help="checkpoint period of both (default 5)")
    parser.add_argument("--target-reward", type=float, default=None,
                        help="the fixed reward (default: 95%% of the lower of the two best 5-step means)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)


def run(args: argparse.Namespace) -> BenchResult:
    if args.steps < 10 or args.pairs < 1:
        raise SystemExit("bench peers: --steps at least 10, --pairs at least 1")
    trl_version = _trl_version()
    base = (args.out / "peers").resolve()
    base.mkdir(parents=True, exist_ok=True)
    settings = [*SINGLE_TURN, *args.set, f"train.save_period={args.save_steps}", "temporal.port=0",
                "temporal.ui_port=0"]
    model_dir = _model(args.config, settings, base)
    cfg = load_config(args.config, parse_overrides(settings))
    problems = base / "problems.jsonl"
    _write_problems(cfg, args.steps * cfg.train.prompts_per_step, problems)
    runs: dict[str, list[dict]] = {"turnkeep": [], "trl": []}
    kills: dict[str, list[dict]] = {"turnkeep": [], "trl": []}
    for pair in range(args.pairs):
        order = ("turnkeep", "trl") if pair % 2 == 0 else ("trl", "turnkeep")
        for side in order:
            runs[side].append(_plain(side, base / f"{side}-{pair}", args, settings, model_dir, problems, cfg))
        for side in order:
            kills[side].append(_killed(side, base / f"{side}-kill-{pair}", args, settings, model_dir, problems, cfg))
    target = args.target_reward if args.target_reward is not None else target_reward(runs)
    figures = {side: [side_figures(found, target) for found in runs[side]] for side in runs}
    return report(args, figures, kills, target, trl_version, cfg)


def _trl_version() -> str:
    try:
        import trl  # late: the peer is needed by this benchmark only (`pip install trl==1.16.0`, the test extra)
    except ImportError:
        raise SystemExit("bench peers: TRL is not installed; install it with `pip install trl==1.16.0` (it is in "
                         "turnkeep's test extra)") from None
    return trl.__version__


def _model(config: Path, settings: list[str], base: Path) -> str:
    flags = [arg for item in settings for arg in ("--set", item)]
    return turnkeep_output(["make-model", "--config", str(config), *flags], base / "make-model.log").split()[-1]


def _write_problems(cfg, count: int, path: Path) -> None:
    from turnkeep.bench.peers_trl import write_problems  # late: it imports TRL's stack (datasets, transformers)

    write_problems(cfg, count, path)


def _launch(side: str, run_dir: Path, args, settings, model_dir: str, problems: Path, cfg,
            resume: bool = False) -> subprocess.Popen:
    if side == "turnkeep":
        command = [sys.executable, "-m", "turnkeep", "run", "--config", str(args.config), "--run-dir", str(run_dir),
                   "--steps", str(args.steps), *[arg for item in settings for arg in ("--set", item)]]
    else:
        command = [sys.executable, "-m", "turnkeep.bench.peers_trl", "--model", model_dir, "--problems",
                   str(problems), "--out", str(run_dir), "--steps", str(args.steps), "--save-steps",
                   str(args.save_steps), "--group-size", str(cfg.rollout.group_size), "--prompts-per-step",
                   str(cfg.train.prompts_per_step), "--lr", str(cfg.train.lr), "--max-completion-length",
                   str(cfg.rollout.max_tokens_per_turn), "--temperature", str(cfg.rollout.temperature),
                   "--seed", str(cfg.run.seed), *(["--resume"] if resume else [])]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = open(run_dir.parent / f"{run_dir.name}.log", "ab")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def step_lines(side: str, run_dir: Path) -> list[dict]:
    """Each train step's line: {"step", "t" (unix), "reward_mean", "tokens", "rss_mib"}."""
    if side == "turnkeep":
        if not (run_dir / "metrics.jsonl").exists():
            return []
        return [{"step": s["step"], "t": s["t"], "reward_mean": s["reward_mean"], "rss_mib": s["rss_tree_mib"],
                 "tokens_per_s": s["rollout_tokens_per_s"]} for s in metric_lines(run_dir, "train_step")]
    path = run_dir / "steps.jsonl"
    if not path.exists():
        return []
    return [{"step": s["step"], "t": s["t"], "reward_mean": s["reward_mean"], "rss_mib": s["rss_mib"],
             "tokens": s["completion_tokens"], "resumed": s.get("resumed", False)}
            for s in map(orjson.loads, path.read_bytes().splitlines())]


def _plain(side: str, run_dir: Path, args, settings, model_dir, problems, cfg) -> dict:
    started = time.time()
    process = _launch(side, run_dir, args, settings, model_dir, problems, cfg)
    if process.wait() != 0:
        raise SystemExit(f"bench peers: the {side} run in {run_dir} exited {process.returncode}; see its log")
    return {"side": side, "started": started, "ended": time.time(), "lines": step_lines(side, run_dir)}


def _killed(side: str, run_dir: Path, args, settings, model_dir, problems, cfg) -> dict:
    """Kill the run once it has trained half its steps; start it again by its own resume path."""
    process = _launch(side, run_dir, args, settings, model_dir, problems, cfg)
    half = args.steps // 2
    while len(step_lines(side, run_dir)) < half:
        if process.poll() is not None:
            raise SystemExit(f"bench peers: the {side} run in {run_dir} exited {process.returncode} before step {half}")
        time.sleep(POLL_S)
    killed_at = max(line["step"] for line in step_lines(side, run_dir))
    if side == "turnkeep":
        kill_everything(run_dir, process.pid)
    else:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    before = len(step_lines(side, run_dir))
    restarted = time.time()
    again = _launch(side, run_dir, args, settings, model_dir, problems, cfg, resume=True)
    if again.wait() != 0:
        raise SystemExit(f"bench peers: the restarted {side} run in {run_dir} exited {again.returncode}")
    after = step_lines(side, run_dir)[before:]
    first = after[0]
    return {"killed_at_step": killed_at, "resumed_at_step": first["step"],
            "steps_lost": killed_at - (first["step"] - 1),
            "restart_to_next_step_s": round(first["t"] - restarted, 1), "final_step": after[-1]["step"]}
