"""`turnkeep bench learn`: the `tool_chat` task on the made-up tiny chat model, start to finish on this machine.

One `turnkeep run` of `configs/tool_chat.toml` (a reasoning-gym task in the `<tool_call>` format, the tiny model
warm-started on the environment's demonstrations, half of them wrong): its reward curve (the mean of each tenth of
the steps; first ten steps against the last ten), wall time, rollout tokens/s and train steps/min. Then the newest
checkpoint is exported (`turnkeep export`: bytes, seconds) and both the base model and the export are scored on the
task's held-out problems (`turnkeep eval`: pass@k, mean reward), so the gain is measured on problems it never
trained on. The run scores the same problems itself too (`[eval]`, before training and every `--eval-every` steps:
the eval curve), and `bench/eval_cost.py` measures what that takes from training.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from turnkeep.bench.eval_cost import measure_eval_cost
from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.bench.runs import metric_lines, run_turnkeep, throughput, turnkeep_output

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tool_chat.toml"


def add_arguments(parser: argparse.ArgumentParser, config: Path = DEFAULT_CONFIG, steps: int = 100,
                  eval_prompts: int = 50, samples: int = 4, eval_every: int = 20, cost_pairs: int = 2) -> None:
    parser.add_argument("--config", type=Path, default=config)
    parser.add_argument("--steps", type=int, default=steps, help="train steps (default %(default)s)")
    parser.add_argument("--eval-prompts", type=int, default=eval_prompts,
                        help="held-out problems scored (default %(default)s)")
    parser.add_argument("--samples", type=int, default=samples, help="samples per held-out problem (default "
                                                                     "%(default)s)")
    parser.add_argument("--eval-every", type=int, default=eval_every, help="in-run evaluation every N train steps "
                                                                         "(default %(default)s; and once before)")
    parser.add_argument("--cost-pairs", type=int, default=cost_pairs, help="pairs of short runs with and without "
                                                                           "in-run evaluation, for its cost "
                                                                           "(default %(default)s; 0: none)")
    parser.add_argument("--cost-steps", type=int, default=30, help="train steps of each cost run (default 30)")
    parser.add_argument("--cost-eval-every", type=int, default=5, help="evaluation every N steps in the cost runs "
                                                                       "(default 5)")


def run(args: argparse.Namespace, name: str = "learn") -> BenchResult:
    base = (args.out / name).resolve()
    config = args.config.resolve()
    run_dir = base / "run"
    sized = [*args.set, f"eval.prompts_limit={args.eval_prompts}", f"eval.samples={args.samples}"]
    wall = run_turnkeep(run_dir, config, args.steps, [*sized, f"eval.every_steps={args.eval_every}",
                                                      "eval.before_training=true"], base / "run.log")
    figures = {**throughput(run_dir), "wall_s": round(wall, 1), "curve": _curve(run_dir),
               "step_seconds": _step_seconds(run_dir),
               "eval_curve": [{key: line[key] for key in ("step", "pass@1", "mean_reward", "eval_s",
                                                          "policy_version_min", "policy_version_max")}
                              for line in metric_lines(run_dir, "eval")]}
    settings = [arg for pair in args.set for arg in ("--set", pair)]
    base_model = turnkeep_output(["make-model", "--config", str(config), *settings],
                                 base / "make-model.log").split()[-1]
    exported = base / "export"
    started = time.monotonic()
    export_line = turnkeep_output(["export", "--run-dir", str(run_dir), "--out", str(exported)], base / "export.log")
    figures["export"] = {"seconds": round(time.monotonic() - started, 1), "line": export_line.strip().splitlines()[-1],
                         "bytes": sum(p.stat().st_size for p in exported.rglob("*") if p.is_file())}
    figures["eval"] = {name: _eval(model, config, settings, args, base / f"eval-{name}.json")
                       for name, model in (("base", base_model), ("trained", str(exported)))}
    if args.cost_pairs:
        figures["eval_cost"] = measure_eval_cost(config, sized, base, pairs=args.cost_pairs, steps=args.cost_steps,
                                                 every=args.cost_eval_every)
    return BenchResult(name, _table(figures), figures, _notes(figures, args))


def _curve(run_dir: Path) -> list[float]:
    rewards = [s["reward_mean"] for s in metric_lines(run_dir, "train_step")]
    tenth = max(1, len(rewards) // 10)
    return [round(statistics.fmean(rewards[i:i + tenth]), 3) for i in range(0, tenth * 10, tenth)
            if rewards[i:i + tenth]]


def _step_seconds(run_dir: Path) -> dict:
    """Where a train step's seconds went: the step on the trainer, its computation, the refit after it."""
    steps = metric_lines(run_dir, "train_step")
    step_s = [s["train_step_s"] for s in steps]
    return {"min": min(step_s), "max": max(step_s), "median": round(statistics.median(step_s), 1),
            "compute_median": round(statistics.median(s["trainer_compute_s"] for s in steps), 1),
            "refit_median": round(statistics.median(s["refit_s"] for s in steps), 1),
            "refit_bytes": max(s["refit_bytes"] for s in steps)}


def _eval(model: str, config: Path, settings: list[str], args: argparse.Namespace, out: Path) -> dict:
    turnkeep_output(["eval", "--model", model, "--config", str(config), *settings, "--samples", str(args.samples),
               "--limit", str(args.eval_prompts), "--out", str(out)], out.with_suffix(".log"))
    return json.loads(out.read_text())


def _table(figures: dict) -> str:
    rows = [["training", f"{figures['reward_first10']:.3f} -> {figures['reward_last10']:.3f}",
             " ".join(f"{r:.2f}" for r in figures["curve"]), figures["steps"], figures["wall_s"],
             figures["rollout_tokens_per_s"], figures["train_steps_per_min"]]]
    for name, result in figures["eval"].items():
        passes = ", ".join(f"pass@{k} {v:.3f}" for k, v in result["pass_at"].items())
        rows.append([f"held-out, {name} model", f"{result['mean_reward']:.3f}", passes, result["prompts"],
                     round(result["seconds"], 1), "", ""])
    if figures["eval_curve"]:
        rows.append(["in-run eval (pass@1 at steps)", "", " ".join(f"{e['step']}:{e['pass@1']:.2f}"
                                                                   for e in figures["eval_curve"]),
                     len(figures["eval_curve"]), round(sum(e["eval_s"] for e in figures["eval_curve"]), 1), "", ""])
    if cost := figures.get("eval_cost"):
        rows.append([f"eval every {cost['every']} steps vs none", "", f"slowdown {cost['slowdown']:.1%}",
                     cost["steps"], "", "", f"{cost['steps_per_min_with']} vs {cost['steps_per_min_without']}"])
    return markdown_table(["what", "reward", "curve (tenths) / pass@k", "steps / prompts", "seconds", "tokens/s",
                           "steps/min"], rows)


def _notes(figures: dict, args: argparse.Namespace) -> list[str]:
    export, step = figures["export"], figures["step_seconds"]
    return [f"train step {step['min']:.1f}-{step['max']:.1f} s (median {step['median']}; trainer compute median "
            f"{step['compute_median']} s), refit of {step['refit_bytes']:,} bytes median {step['refit_median']} s; "
            f"peak RSS of the run's process tree {figures['peak_rss_tree_mib']:,} MiB",
            f"reward of the first ten train steps against the last ten; the curve is the mean of each tenth of the "
            f"{figures['steps']} steps",
            f"held-out: {args.eval_prompts} problems the run never trained on, {args.samples} samples each, "
            "temperature 1; a sample is correct at reward 1",
            f"export of the newest checkpoint: {export['bytes']:,} bytes in {export['seconds']} s "
            f"({export['line']})",
            "in-run eval: the same held-out problems scored by the run itself, on its engines beside training, before "
            "the first step and every --eval-every steps (its seconds overlap training)",
            "eval cost: train steps/min of the training loop, medians of --cost-pairs alternating runs of "
            "--cost-steps steps with evaluation every --cost-eval-every steps and without"]
