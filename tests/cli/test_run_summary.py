"""The end-of-run line counts the steps this process trained, not the steps a restored run had before it."""

from __future__ import annotations

from pathlib import Path

from turnkeep.cli.run import steps_done
from turnkeep.controller.runtime import RunSummary


def _summary(steps: int, trained: int | None) -> RunSummary:
    return RunSummary(steps, 76.0, Path("/r"), None, 100.0, steps_trained=trained)


def test_a_restored_run_counts_its_own_steps_and_says_where_the_run_stands() -> None:
    assert steps_done(_summary(60, 12)) == "12 steps (49 to 60; the run is at step 60)"
    assert steps_done(_summary(60, 60)) == "60 steps"
    assert steps_done(_summary(60, 0)) == "no new step (the run is at step 60)"
