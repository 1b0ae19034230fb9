"""A step's rows split between the ranks: whole groups to one rank, as even as groups allow; every rank makes as
many forward/backward passes as the largest share needs; a call that fails on one rank ends at once, though another
rank (frozen) never answers, and tells the group's owner."""

from __future__ import annotations

import asyncio

import pytest

from tests.gpu_workers.test_trainer_ranks import _rows
from turnkeep.gpu_workers import rank_group
from turnkeep.gpu_workers.grpo import build_batch
from turnkeep.gpu_workers.rank_group import RankFailed, RankGroup, micro_batch_count, split_by_group
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


class _FrozenFollower:
    """A rank whose process is frozen: its calls never return."""

    class call:  # noqa: N801 - shaped as a Ray actor method
        @staticmethod
        def remote(method: str, *args):
            return asyncio.Event().wait()


class _TimedOutRank:
    """Rank 0, whose collective gave up waiting for the frozen rank (gloo's timeout, `train.hang_s`)."""

    def backward(self) -> None:
        raise RuntimeError("[gloo] Timed out waiting 300000ms for recv operation to complete")


def test_the_first_failing_rank_ends_the_call_though_a_frozen_one_never_answers(monkeypatch):
    monkeypatch.setattr(rank_group, "BROKEN_GRACE_S", 0.1)
    broken: list[Exception] = []
    group = RankGroup(_TimedOutRank(), [_FrozenFollower()], on_broken=broken.append)

    async def call():
        return await asyncio.wait_for(group.all("backward"), 10)

    with pytest.raises(RankFailed, match="trainer rank 0 of 2 failed in backward: RuntimeError: .gloo. Timed out"):
        asyncio.run(call())
    assert len(broken) == 1 and isinstance(broken[0], RankFailed)


class _AnsweringFollower:
    class call:  # noqa: N801 - shaped as a Ray actor method
        @staticmethod
        async def remote(method: str, *args):
            return "done"


def test_a_failure_every_rank_answered_raises_as_before_and_leaves_the_group():
    broken: list[Exception] = []
    group = RankGroup(_TimedOutRank(), [_AnsweringFollower()], on_broken=broken.append)
    with pytest.raises(RankFailed, match="trainer rank 0 of 2 failed in backward"):
        asyncio.run(group.all("backward"))
    assert broken == []  # a damaged checkpoint's load fails this way on every rank: its caller skips it


class _AnsweringRank:
    def refresh_copy(self) -> None:
        return None


def test_a_rank_frozen_outside_a_collective_breaks_the_group_hang_s_after_the_others_answered():
    broken: list[Exception] = []
    group = RankGroup(_AnsweringRank(), [_FrozenFollower()], on_broken=broken.append, hang_s=0.2)

    async def call():
        return await asyncio.wait_for(group.all("refresh_copy"), 10)

    with pytest.raises(RankFailed, match=r"trainer rank 1 of 2 did not answer refresh_copy within train.hang_s = 0.2s"):
        asyncio.run(call())
    assert len(broken) == 1 and broken[0].probe == "no answer"
