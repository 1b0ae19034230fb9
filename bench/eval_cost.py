"""What in-run evaluation takes from training: short runs of the same config with evaluation every N steps and
without, alternating (with, without, with, ...) so a drift of the machine's speed falls on both; train steps/min of
each run's training loop (`bench.runs.throughput`), the median of each side and their ratio."""

from __future__ import annotations

import statistics
from pathlib import Path

from turnkeep.bench.runs import metric_lines, run_turnkeep, throughput

OFF = ["eval.every_steps=0", "eval.before_training=false"]


def measure_eval_cost(config: Path, settings: list[str], base: Path, *, pairs: int, steps: int,
                      every: int) -> dict:
    """`settings`: the benchmark's `--set` pairs (KEY=VALUE), with the evaluation's size already in them."""
    runs: dict[str, list[dict]] = {"with": [], "without": []}
    for pair in range(pairs):
        for side, extra in (("with", [f"eval.every_steps={every}", "eval.before_training=false"]), ("without", OFF)):
            run_dir = base / f"cost-{side}-{pair}"
            run_turnkeep(run_dir, config, steps, [*settings, *extra], base / f"cost-{side}-{pair}.log")
            evals = metric_lines(run_dir, "eval")
            runs[side].append({"steps_per_min": throughput(run_dir)["train_steps_per_min"], "evals": len(evals),
                               "eval_s": round(sum(e["eval_s"] for e in evals), 1)})
    with_, without = (statistics.median(r["steps_per_min"] for r in runs[side]) for side in ("with", "without"))
    return {"pairs": pairs, "steps": steps, "every": every, "runs": runs,
            "steps_per_min_with": with_, "steps_per_min_without": without,
            "slowdown": round(1 - with_ / without, 3) if without else None}
