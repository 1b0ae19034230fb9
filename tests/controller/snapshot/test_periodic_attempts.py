"""Periodic attempts: set, they come every interval; unset, only a parked run has them."""

from __future__ import annotations

from turnkeep.config.loader import parse_config
from turnkeep.controller.snapshot.periodic_attempts import PARKED_INTERVAL_S, periodic_interval_s


def test_unset_journaled_agents_snapshot_at_checkpoints_only_and_parked_ones_every_20_s():
    unset = parse_config({}).snapshot.attempt_interval_s
    assert unset is None
    assert periodic_interval_s(unset, "journal") is None
    assert periodic_interval_s(unset, "parked") == PARKED_INTERVAL_S == 20.0


def test_a_set_interval_holds_for_both_kinds():
    assert periodic_interval_s(7.5, "journal") == 7.5 and periodic_interval_s(7.5, "parked") == 7.5
