"""The cut checks the train pump against the attempt's hold before it writes anything."""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest

from bench.filled_controller import STEP, FilledController
from controller.errors import InvariantBroken, TrainerMoved
from controller.snapshot.cut import STATE_FILE, cut_data_plane
from schemas.snapshot import TrainerHoldResult


def _controller() -> FilledController:
    controller = FilledController()
    controller.fill(rows=20, turns=2, parked=[], rng=random.Random(0))
    return controller


def test_a_cut_under_a_matching_hold_writes_the_state_and_counts_it(tmp_path):
    controller = _controller()
    hold = TrainerHoldResult(step=STEP, policy_version=controller.training.policy_version)
    cut = asyncio.run(cut_data_plane(controller, tmp_path, STEP, hold))
    state = orjson.loads((tmp_path / STATE_FILE).read_bytes())
    assert cut.data_plane_rows == len(state["data_plane"]["rows"]) == 20
    assert cut.policy_version == hold.policy_version and cut.artifact.path == str(STATE_FILE)


def test_a_trainer_that_moved_under_the_hold_is_a_broken_invariant_and_nothing_is_written(tmp_path):
    controller = _controller()
    hold = TrainerHoldResult(step=STEP, policy_version=controller.training.policy_version)
    controller.training.policy_version += 1  # same step, another version: a refit nobody stepped for
    with pytest.raises(InvariantBroken, match="moved under the hold"):
        asyncio.run(cut_data_plane(controller, tmp_path, STEP, hold))
    assert not (tmp_path / STATE_FILE).exists()


def test_without_a_hold_a_step_past_the_anchor_wastes_the_attempt(tmp_path):
    controller = _controller()
    controller.training.step = STEP + 1
    with pytest.raises(TrainerMoved, match=f"step {STEP} -> {STEP + 1}"):
        asyncio.run(cut_data_plane(controller, tmp_path, STEP, hold=None))
    assert not (tmp_path / STATE_FILE).exists()
