"""A step's rows split between the ranks: whole groups to one rank, as even as groups allow; every rank makes as
many forward/backward passes as the largest share needs."""

from __future__ import annotations

from tests.gpu_workers.test_trainer_ranks import _rows
from turnkeep.gpu_workers.grpo import build_batch
from turnkeep.gpu_workers.rank_group import micro_batch_count, split_by_group
from turnkeep.schemas.rollout import RolloutRow


def test_a_share_holds_whole_groups_and_every_row_once():
    batch = build_batch([RolloutRow.model_validate(r) for r in _rows(0, groups=5)], 0)
    shares = split_by_group(batch, 2)
    assert [len(s.group_ids) for s in shares] in ([4, 6], [6, 4])
    assert set(shares[0].group_ids).isdisjoint(shares[1].group_ids)
    assert split_by_group(batch, 7)[5:] == [None, None]  # more ranks than groups: the rest get nothing


def test_every_rank_makes_the_passes_of_the_largest_share():
    batch = build_batch([RolloutRow.model_validate(r) for r in _rows(0, groups=5)], 0)
    shares = split_by_group(batch, 2)
    assert micro_batch_count(shares, 4) == 2 and micro_batch_count(shares, None) == 1
    assert micro_batch_count([None, None], 3) == 1
