"""What a person sees: one JSON line per train step in metrics.jsonl and a live progress line."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from turnkeep.controller.pumps.train_pump import StepReport
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.controller.stores.metrics_totals import add_totals, totals_at
from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.primitives.process_roles import rss_mib_by_role
from turnkeep.schemas.choices import MetricsKind, Outcome


class MetricsSink:
    def __init__(self, run_dir: Path, stats: RunStats, max_steps: int | None, out: TextIO = sys.stderr) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._stats = stats
        self._max_steps = max_steps
        self._out = out
        self._started = time.monotonic()
        self._last = self._started
        self.peak_rss_mib = 0.0
        self.peak_rss_mib_by_role: dict[str, float] = {}
        self.steps_trained = 0
        """Train steps this process trained (a restored run's earlier steps are not its own)."""
        self._base: dict | None = None
        self._engine_tokens: dict[int, int] = {}

    def _base_totals(self, step: int) -> dict:
        """The lineage's totals at the step before this process's first: read once, at its first step."""
        if self._base is None:
            self._base = totals_at(self.path, step - 1)
        return self._base

    def step(self, report: StepReport, epoch: int = 0) -> dict:
        """`epoch`: whole passes over a prompts file so far (0 for generated problems)."""
        now = time.monotonic()
        line = {
            "kind": MetricsKind.TRAIN_STEP,
            "t": round(time.time(), 3),
            "step": report.step,
            "reward_mean": round(report.reward_mean, 4),
            **({"reward_parts_mean": {k: round(v, 4) for k, v in report.reward_parts_mean.items()}}
               if report.reward_parts_mean else {}),
            "rollout_tokens_per_s": round(self._stats.take_generated_tokens() / max(now - self._last, 1e-6), 1),
            "train_step_s": round(report.train_step_s, 3),
            "refit_s": round(report.refit_s, 3),
            "refit_bytes": report.refit_bytes,
            "refit_gb_per_s": round(report.refit_bytes / max(report.refit_s, 1e-9) / 1e9, 3),
            "groups_trained": report.groups_trained,
            "policy_version": report.policy_version,
            "data_epoch": epoch,
            "staleness_max": report.staleness_max,
            "engines_live": report.engines_live,
            "engine_tokens_per_s": self._engine_rates(report.engine_tokens, now),
            **add_totals(self._base_totals(report.step), {
                "rows_sealed_total": self._stats.rows_sealed,
                "retries_total": self._stats.retries,
                "rollouts_interrupted_total": self._stats.interrupted,
                "siblings_dropped_total": dict(self._stats.siblings_dropped),
                "groups_discarded_total": dict(self._stats.groups_discarded),
                "groups_zero_signal_total": self._stats.groups_discarded.get("zero_signal", 0),
                "recovery_by_env_total": {env: dict(c) for env, c in sorted(self._stats.recovery_by_env.items())},
            }),
            "wall_s": round(now - self._started, 2),
            "rss_tree_mib": round(self._sample_memory()),
            **{f"trainer_{key}": value for key, value in report.trainer.items() if key != "policy_version"},
        }
        self._last = now
        self.steps_trained += 1
        self.peak_rss_mib = max(self.peak_rss_mib, line["rss_tree_mib"])
        append_jsonl(self.path, line, durable=False)
        self._print_progress(line)
        return line

    def _engine_rates(self, tokens: dict[int, int], now: float) -> dict[str, float]:
        """Per engine, tokens/s since the last step (an engine new since then counts from its start)."""
        elapsed = max(now - self._last, 1e-6)
        rates = {}
        for k, count in sorted(tokens.items()):
            before = self._engine_tokens.get(k, 0)
            # A replacement counts from zero again.
            rates[str(k)] = round((count - before if count >= before else count) / elapsed, 1)
        self._engine_tokens = dict(tokens)
        return rates

    def _sample_memory(self) -> float:
        by_role = rss_mib_by_role()
        for role, mib in by_role.items():
            self.peak_rss_mib_by_role[role] = max(self.peak_rss_mib_by_role.get(role, 0.0), mib)
        return sum(by_role.values())

    def evaluation(self, line: dict) -> None:
        """An evaluation's result line, and one line on the console."""
        append_jsonl(self.path, line, durable=True)
        passes = " ".join(f"{key} {value:.3f}" for key, value in line.items() if key.startswith("pass@"))
        failed = f", {line['samples_failed']} samples failed" if line["samples_failed"] else ""
        self._out.write(f"{chr(13) if self._out.isatty() else ''}eval step {line['step']} ({line['trigger']}): "
                        f"{line['prompts']} prompts x {line['samples']}: mean reward {line['mean_reward']:.3f} "
                        f"{passes} in {line['eval_s']:.1f}s{failed}\n")
        self._out.flush()

    def finish(self) -> None:
        """The run's peak memory per process role, as one `"kind": "memory"` line."""
        peaks = {role: round(mib) for role, mib in sorted(self.peak_rss_mib_by_role.items())}
        append_jsonl(self.path, {"kind": MetricsKind.MEMORY, "peak_rss_mib_by_role": peaks,
                                 "peak_rss_tree_mib": round(self.peak_rss_mib)}, durable=False)

    def snapshot(self, result) -> None:
        """One line per snapshot attempt, between the step lines."""
        closed = f", admission closed {result.admission_closed_s:.2f}s" if result.admission_closed_s else ""
        waited = f", trainer waited {result.trainer_wait_s:.2f}s" if result.trainer_wait_s else ""
        text = f"snapshot {result.checkpoint_id}: {result.outcome} in {result.wall_s:.2f}s{closed}{waited}"
        if result.outcome != Outcome.PUBLISHED:
            text += f" ({result.reason})"
        if self._out.isatty():
            text = "\r" + text.ljust(100) + "\n"
        else:
            text += "\n"
        self._out.write(text)
        self._out.flush()

    def _print_progress(self, line: dict) -> None:
        elapsed = line["wall_s"]
        eta = ""
        if self._max_steps:
            remaining = (self._max_steps - line["step"]) * elapsed / line["step"]
            eta = f" eta {remaining:5.0f}s"
        total = f"/{self._max_steps}" if self._max_steps else ""
        text = (
            f"step {line['step']}{total} reward {line['reward_mean']:.3f} "
            f"rollout {line['rollout_tokens_per_s']:.0f} tok/s staleness {line['staleness_max']} "
            f"train {line['train_step_s']:.2f}s{eta}"
        )
        if self._out.isatty():
            self._out.write("\r" + text.ljust(100))
        else:
            self._out.write(text + "\n")
        self._out.flush()
