"""Which step a rebuilt trainer can load from its ranks' copies: the newest every rank's shard has a copy of, at
one of its two holders; and why none, naming the shards whose holders are both gone."""

from turnkeep.gpu_workers.rank_copies import complete_step, holders_of


def test_each_shard_is_held_by_its_own_keeper_and_the_next_ranks():
    assert [holders_of(rank, 4) for rank in range(4)] == [[0, 1], [1, 2], [2, 3], [0, 3]]
    assert holders_of(0, 1) == [0]  # one rank: its own keeper only
    assert [holders_of(rank, 2) for rank in range(2)] == [[0, 1], [0, 1]]


def test_the_newest_step_every_shard_has_wins_even_with_a_keeper_gone():
    # 3 ranks; keeper 1 is gone (rank 1's node died): rank 1's shard is still at keeper 2, rank 0's at keeper 0.
    held = {0: {0: [7, 8], 2: [7]}, 2: {2: [7], 1: [7, 8]}}
    assert complete_step(held, 3) == (7, "")  # rank 2's copy of step 8 reached neither of its keepers
    held[0][2] = [7, 8]  # it reached one of them
    assert complete_step(held, 3) == (8, "")


def test_a_step_whose_copies_were_still_arriving_falls_back_to_the_one_before():
    # The group died while step 5's copies arrived: rank 1's never left it, so step 4 is the newest complete one.
    held = {0: {0: [4, 5], 1: [4]}, 1: {1: [4], 0: [4, 5]}}
    assert complete_step(held, 2) == (4, "")


def test_both_holders_of_a_shard_gone_leave_no_step_and_say_which():
    held = {0: {0: [3], 2: [3]}}  # keepers 1 and 2 died together: rank 1's shard had no other holder
    step, why = complete_step(held, 3)
    assert step is None
    assert why.startswith("no copy of rank(s) [1]'s shard is left (held by keepers [1, 2], which are gone")
    assert complete_step({}, 2)[0] is None


def test_copies_of_steps_no_step_has_in_common_are_named():
    step, why = complete_step({0: {0: [3], 1: [2]}}, 2)
    assert step is None and "different steps" in why and "0: [3]" in why and "1: [2]" in why
