"""Preflight reads the anchor from the train pump alone, and skips only when nothing changed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from turnkeep.controller.pumps.train_pump import TrainPump
from turnkeep.controller.snapshot.coordinator import SnapshotCoordinator
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.primitives.holds import HoldSet


class Health:
    def __init__(self) -> None:
        self.turn_commits = 0

    async def health(self) -> dict:
        return {"turn_commits": self.turn_commits}


def _coordinator(tmp_path) -> tuple[SnapshotCoordinator, SimpleNamespace]:
    training = TrainPump(None, None, None, None, None, None, None, None, on_groups_finished=lambda: None,
                         write_checkpoint=None, announce_checkpoint=None, on_step=lambda report: None)
    controller = SimpleNamespace(training=training, dataloader=SimpleNamespace(next_index=0), stats=RunStats(),
                                 data_plane=DataPlane(), env_client=Health(), audit_snapshot=lambda *a: None)
    coordinator = SnapshotCoordinator(run_id="r", incarnation=1, run_dir=tmp_path, fingerprint="f",
                                      controller=controller, trainer=None, environments=[], interval_s=5)
    return coordinator, controller


def test_the_anchor_is_the_train_pumps_newest_checkpoint_and_an_unchanged_run_is_skipped(tmp_path):
    coordinator, controller = _coordinator(tmp_path)
    skip = lambda anchor: asyncio.run(coordinator.skip_reason(anchor))  # noqa: E731
    assert skip(0) == "no trainer checkpoint yet"
    controller.training.restore(12, policy_version=12)
    assert skip(12) is None
    assert skip(11) == "no trainer checkpoint for the current step 12 (newest is step_12)"
    asyncio.run(coordinator.mark_cut("r.snapshot.12.1"))
    assert skip(12) is None  # a cut alone is not a published snapshot
    coordinator.note_published("r.snapshot.12.1", 12, tmp_path)
    assert skip(12) == "nothing changed since the last published snapshot"
    controller.env_client.turn_commits += 1  # an agent committed a turn since
    assert skip(12) is None
    controller.training.continue_from(13, policy_version=13)
    assert skip(12) == "no trainer checkpoint for the current step 13 (newest is step_12)"


def test_an_attempts_holds_are_written_as_they_are_taken_renewed_and_released(tmp_path):
    changes = []

    class Trainer:
        class hold_renew:  # noqa: N801 - a Ray actor method's shape: `.remote(...)`
            @staticmethod
            async def remote(holder, lease_s):
                return True

    controller = SimpleNamespace(admission=HoldSet("admission"), deadline_holds=HoldSet("deadlines"),
                                 audit_hold=lambda *args: changes.append(args))
    coordinator = SnapshotCoordinator(run_id="r", incarnation=1, run_dir=tmp_path, fingerprint="f",
                                      controller=controller, trainer=Trainer, environments=[], interval_s=5)
    coordinator.close_admission("r.snapshot.3.1", 30.0)
    asyncio.run(coordinator.renew_leases("r.snapshot.3.1", 30.0, participants=False))
    coordinator.reopen_admission("r.snapshot.3.1")
    holder = "snapshot:r.snapshot.3.1"
    assert changes == [
        ("taken", holder, ["admission", "deadlines"], 30.0),
        ("renewed", holder, ["admission"], 30.0),
        ("renewed", holder, ["deadlines"], 30.0),
        ("released", holder, ["admission", "deadlines"]),
    ]
    assert controller.admission.is_clear() and controller.deadline_holds.is_clear()
