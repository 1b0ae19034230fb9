"""The cut checks the train pump against the attempt's hold before it writes anything."""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest

from turnkeep.bench.filled_controller import STEP, FilledController
from turnkeep.controller.journal.replay import resolve_state
from turnkeep.controller.snapshot.cut import STATE_FILE, cut_data_plane
from turnkeep.primitives.audit_log import AUDIT_FILE, AuditLog, read_audit
from turnkeep.primitives.snapshot_errors import InvariantBroken, TrainerMoved
from turnkeep.schemas.attempt_steps import TrainerHoldResult
from turnkeep.schemas.audit import CutTaken, ids_digest, row_key


def _controller(run_dir) -> FilledController:
    controller = FilledController()
    controller.start_journal(run_dir)
    controller.fill(rows=20, turns=2, parked=[], rng=random.Random(0))
    return controller


def test_a_cut_under_a_matching_hold_writes_the_state_and_counts_it(tmp_path):
    controller = _controller(tmp_path)
    hold = TrainerHoldResult(step=STEP, policy_version=controller.training.policy_version)
    cut = asyncio.run(cut_data_plane(controller, tmp_path, STEP, hold))
    saved = orjson.loads((tmp_path / STATE_FILE).read_bytes())
    assert "data_plane" not in saved  # a journal position, not a copy of the rows
    state = resolve_state(tmp_path, saved)
    assert cut.data_plane_rows == len(state["data_plane"]["rows"]) == 20
    assert state["data_plane"] == orjson.loads(orjson.dumps(controller.data_plane.state_dict()))
    assert cut.policy_version == hold.policy_version and cut.artifact.path == str(STATE_FILE)


def test_a_cut_before_the_journal_started_is_refused(tmp_path):
    controller = FilledController()
    hold = TrainerHoldResult(step=STEP, policy_version=controller.training.policy_version)
    with pytest.raises(InvariantBroken, match="before the controller started its journal"):
        asyncio.run(cut_data_plane(controller, tmp_path, STEP, hold))


def test_a_trainer_that_moved_under_the_hold_is_a_broken_invariant_and_nothing_is_written(tmp_path):
    controller = _controller(tmp_path)
    hold = TrainerHoldResult(step=STEP, policy_version=controller.training.policy_version)
    controller.training.policy_version += 1  # same step, another version: a refit nobody stepped for
    with pytest.raises(InvariantBroken, match="moved under the hold"):
        asyncio.run(cut_data_plane(controller, tmp_path, STEP, hold))
    assert not (tmp_path / STATE_FILE).exists()


def test_without_a_hold_a_step_past_the_anchor_wastes_the_attempt(tmp_path):
    controller = _controller(tmp_path)
    controller.training.step = STEP + 1
    with pytest.raises(TrainerMoved, match=f"step {STEP} -> {STEP + 1}"):
        asyncio.run(cut_data_plane(controller, tmp_path, STEP, hold=None))
    assert not (tmp_path / STATE_FILE).exists()


def test_a_journal_attempt_whose_checkpoint_hold_was_gone_says_so_and_how_to_avoid_it(tmp_path):
    controller = _controller(tmp_path)
    controller.training.step = STEP + 1
    with pytest.raises(TrainerMoved, match=f"checkpoint hold was gone before the cut \\(step {STEP} -> {STEP + 1}.*"
                                           "raise snapshot.lease_s"):
        asyncio.run(cut_data_plane(controller, tmp_path, STEP, hold=None, marks=[], checkpoint_hold=True))
    assert not (tmp_path / STATE_FILE).exists()


def test_a_cut_records_what_it_holds_in_the_audit_log_before_the_barrier_opens(tmp_path):
    controller = _controller(tmp_path)
    controller.audit = AuditLog(tmp_path / AUDIT_FILE, 3)
    hold = TrainerHoldResult(step=STEP, policy_version=controller.training.policy_version)
    staging = tmp_path / "staging"
    staging.mkdir()
    cut = asyncio.run(cut_data_plane(controller, staging, STEP, hold))
    [event] = list(read_audit(tmp_path))  # flushed by the cut itself
    state = resolve_state(tmp_path, orjson.loads((staging / STATE_FILE).read_bytes()))
    rows = [row_key(row["group_id"], row["sibling"]) for row in state["data_plane"]["rows"]]
    groups = [group["group_id"] for group in state["group_ledger"]["groups"]]
    assert isinstance(event, CutTaken) and (event.kind, event.step, event.inc) == ("snapshot", STEP, 3)
    assert event.cut_unix_s == cut.cut_unix_s == state["cut_unix_s"]  # the key a restore of it reports
    assert (event.rows, event.rows_digest) == (20, ids_digest(rows))
    assert (event.groups, event.groups_digest) == (len(groups), ids_digest(groups))
    assert event.next_group_index == state["dataloader"]["next_index"]
    assert (event.continuations, event.continuations_digest) == (0, ids_digest([]))
