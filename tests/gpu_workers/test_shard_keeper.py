"""A keeper holds a shard's copy of the step being copied beside the last complete one, until the trainer commits;
a checkpoint load makes it forget every copy."""

from turnkeep.gpu_workers.shard_keeper import ShardCopies


def test_a_keeper_keeps_two_steps_until_one_is_committed():
    copies = ShardCopies()
    for step in (1, 2, 3):
        copies.put(0, step, b"r0-%d" % step)
    copies.put(1, 2, b"r1-2")
    assert copies.held() == {0: [2, 3], 1: [2]}  # rank 1's copy of step 3 has not arrived: step 2 stays whole
    copies.put(1, 3, b"r1-3")
    copies.commit(3)
    assert copies.held() == {0: [3], 1: [3]}
    assert copies.get(0, 3) == b"r0-3" and copies.get(0, 2) is None and copies.get(5, 3) is None
    assert copies.held_bytes() == 8
    copies.forget()
    assert copies.held() == {} and copies.held_bytes() == 0
