"""A journal attempt at a trainer checkpoint keeps the train pump's checkpoint hold instead of taking its own; its cut
releases that hold once taken (the anchor's, no other), and a trainer that does not answer leaves the cut standing
and says so in the result, for the workflow to release it on the trainer's queue."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from turnkeep.activities.snapshot_activities import SnapshotActivities
from turnkeep.bench.filled_controller import STEP, FilledController
from turnkeep.controller.snapshot.coordinator import SnapshotCoordinator
from turnkeep.controller.snapshot.cut import STATE_FILE
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.controller.stores import snapshot_store
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.attempt_steps import CutInput, TrainerHoldResult
from turnkeep.schemas.names import checkpoint_holder, checkpoint_id

RUN = "run"


class RemoteMethod:
    def __init__(self, fn) -> None:
        self._fn = fn

    def remote(self, *args):
        async def call():
            return self._fn(*args)
        return call()


class Trainer:
    """The trainer actor's hold set as the controller reaches it through Ray (`.method.remote(...)`)."""

    def __init__(self, answers: bool = True) -> None:
        self.hold = HoldSet("trainer")
        self.hold_release_timed = RemoteMethod(self._release if answers else self._dead)

    def _release(self, holder: str) -> tuple[bool, float]:
        return self.hold.release(holder), 0.25

    def _dead(self, holder: str) -> tuple[bool, float]:
        raise RuntimeError("The actor died unexpectedly before finishing this task.")


class QuietServers:
    async def health(self) -> dict:
        return {"turn_commits": 0}


def _cut(tmp_path: Path, trainer: Trainer, **changes):
    controller = FilledController()
    controller.start_journal(tmp_path)
    controller.fill(rows=4, turns=1, parked=[], rng=random.Random(0))
    controller.stats, controller.env_client = RunStats(), QuietServers()
    (tmp_path / "checkpoints" / f"step_{STEP}").mkdir(parents=True)
    staging = snapshot_store.open_staging(tmp_path, STEP, 1)
    ctx = SnapshotCoordinator(run_id=RUN, incarnation=1, run_dir=tmp_path, fingerprint="f", controller=controller,
                              trainer=trainer, environments=[], interval_s=None)
    fields = dict(run_id=RUN, checkpoint_id=checkpoint_id(RUN, STEP, 1), incarnation=1, staging_dir=str(staging),
                  anchor_step=STEP, hold=None, marks=[], checkpoint_hold=True)
    result = asyncio.run(SnapshotActivities(ctx).cut(CutInput(**{**fields, **changes})))
    return result, staging


def test_the_cut_releases_the_checkpoint_hold_of_its_anchor_and_no_other(tmp_path):
    trainer = Trainer()
    trainer.hold.add(checkpoint_holder(STEP), 60)
    trainer.hold.add(checkpoint_holder(STEP + 1), 60)
    result, staging = _cut(tmp_path, trainer)
    assert result.checkpoint_hold_released and result.trainer_wait_s == 0.25
    assert trainer.hold.holders() == {checkpoint_holder(STEP + 1)}
    assert (staging / STATE_FILE).exists()


def test_a_cut_that_keeps_no_checkpoint_hold_releases_nothing(tmp_path):
    trainer = Trainer()
    trainer.hold.add(checkpoint_holder(STEP), 60)
    result, _ = _cut(tmp_path, trainer, checkpoint_hold=False)
    assert not result.checkpoint_hold_released
    assert trainer.hold.holders() == {checkpoint_holder(STEP)}


def test_a_trainer_that_does_not_answer_leaves_the_cut_standing_and_the_release_to_the_workflow(tmp_path, caplog):
    result, staging = _cut(tmp_path, Trainer(answers=False))
    assert not result.checkpoint_hold_released and result.trainer_wait_s == 0
    assert (staging / STATE_FILE).exists() and result.data_plane_rows == 4
    assert "could not release checkpoint:" in caplog.text


@pytest.mark.parametrize("changes", [
    {"hold": TrainerHoldResult(step=STEP, policy_version=0)},  # it took its own hold: nothing of the pump's to keep
    {"marks": None},  # a parked attempt always takes its own hold
])
def test_a_cut_that_claims_the_checkpoint_hold_where_it_cannot_have_one_is_refused(tmp_path, changes):
    trainer = Trainer()
    trainer.hold.add(checkpoint_holder(STEP), 60)
    with pytest.raises(ApplicationError, match="refused checkpoint_hold = True"):
        _cut(tmp_path, trainer, **changes)
    assert trainer.hold.holders() == {checkpoint_holder(STEP)}
