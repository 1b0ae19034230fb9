"""Held-out evaluation in a real run (`configs/tool_chat.toml`, the tiny chat model): before training and every 2
steps an evaluation plays the task's held-out problems on the run's engines beside training. The first is cut by a
whole-tree kill at a pinned moment (the `evaluation` chaos point: 3 samples journaled, the journal held) while
training goes on; an operator asks for another while the run waits to be killed (`turnkeep eval --run-dir`, the run workflow's `evaluate_now` signal). The same command
started again finishes both, scoring no sample twice, and writes each one's line to metrics.jsonl once; `status`
shows the last one; every invariant of the run directory holds."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tests.run_command import metrics, short_run_dir, small_run_settings, train_steps, turnkeep, wait_until
from turnkeep.chaos.targets import kill_everything
from turnkeep.chaos.verdict import check_run_dir
from turnkeep.controller.pumps.eval_pump import CHAOS_AFTER_SAMPLES, CHAOS_POINT
from turnkeep.primitives.audit_log import read_audit
from turnkeep.primitives.chaos_points import ENV_POINT, ENV_WAIT, marker_path

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tool_chat.toml"
PROMPTS, SAMPLES = 6, 2


def _journal(run_dir: Path) -> list[dict]:
    path = run_dir / "eval" / "evaluations.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def _command(stack_config, run_dir: Path) -> list[str]:
    return ["run", "--config", str(CONFIG), *small_run_settings(stack_config), "--set", f"run.run_dir={run_dir}",
            "--set", "run.steps=6", "--set", "eval.every_steps=2", "--set", f"eval.prompts_limit={PROMPTS}",
            "--set", f"eval.samples={SAMPLES}", "--set", "model.tiny.warm_start_steps=50"]


def _ask_for_an_evaluation(run_dir: Path) -> None:
    asked = subprocess.run([sys.executable, "-m", "turnkeep", "eval", "--run-dir", str(run_dir)], capture_output=True,
                           text=True, timeout=120)
    assert asked.returncode == 0, asked.stderr[-2000:]
    assert "asked the run for an evaluation of its current weights" in asked.stdout


def test_an_evaluation_cut_by_a_kill_finishes_after_the_restart_scoring_each_sample_once(stack_config,
                                                                                        monkeypatch) -> None:
    run_dir = short_run_dir("tk-eval-")
    log = run_dir.parent / "run.log"
    monkeypatch.setenv(ENV_POINT, CHAOS_POINT)
    monkeypatch.setenv(ENV_WAIT, "600")
    first = turnkeep(*_command(stack_config, run_dir), log=log)
    monkeypatch.delenv(ENV_POINT)
    wait_until(marker_path(run_dir).exists, 600, "the evaluation chaos point", first)
    # Training never waits for an evaluation: it goes on while this one is held.
    wait_until(lambda: train_steps(run_dir) >= 4, 300, "train steps while the evaluation is held", first)
    _ask_for_an_evaluation(run_dir)
    wait_until(lambda: any(line.get("trigger") == "operator" for line in _journal(run_dir)), 60,
               "the operator's evaluation in the journal", first)
    kill_everything(run_dir, first.pid)
    first.wait(timeout=60)
    cut = Counter((line["step"], line["trigger"]) for line in _journal(run_dir) if line["kind"] == "scored")
    [(held, scored_before)] = cut.items()  # the evaluation the chaos point held: the first one (before training)
    assert not metrics(run_dir, "eval") and CHAOS_AFTER_SAMPLES <= scored_before < PROMPTS * SAMPLES
    assert held == (0, "before_training")

    again = turnkeep(*_command(stack_config, run_dir), log=log)
    assert again.wait(timeout=900) == 0, log.read_text()[-4000:]
    lines = metrics(run_dir, "eval")
    by_key = Counter((line["step"], line["trigger"]) for line in lines)
    assert max(by_key.values()) == 1, by_key  # one line per evaluation
    # Periodic ones asked for while the held one waited gave way to the newest (2 to 4, ...); the last step's stands.
    assert {held, (6, "every_steps")} <= set(by_key), by_key
    assert any(trigger == "operator" for _, trigger in by_key), by_key
    resumed = next(line for line in lines if (line["step"], line["trigger"]) == held)
    assert resumed["samples_resumed"] == scored_before and resumed["prompts"] == PROMPTS
    scored = Counter((line["step"], line["trigger"], line["prompt"], line["sample"]) for line in _journal(run_dir)
                     if line["kind"] == "scored")
    assert max(scored.values()) == 1  # no sample scored twice, across the kill
    for line in lines:
        assert sum(1 for key in scored if key[:2] == (line["step"], line["trigger"])) == PROMPTS * SAMPLES
        assert 0.0 <= line["pass@1"] <= line["pass@2"] <= 1.0 and line["samples_failed"] == 0
    status = subprocess.run([sys.executable, "-m", "turnkeep", "status", str(run_dir)], capture_output=True,
                            text=True, timeout=60)
    assert "  last evaluation: step " in status.stdout, status.stdout
    # Evaluation episodes are not training's: no turn of theirs is audited or journaled as a rollout's.
    assert not [e for e in read_audit(run_dir) if str(getattr(e, "rollout_id", "")).startswith("eval-")]
    verdict = check_run_dir(run_dir)
    assert verdict.ok, verdict.format()
