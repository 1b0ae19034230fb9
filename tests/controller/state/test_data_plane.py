from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.schemas.rollout import RolloutRow, Segment


def make_row(group_id: str, sibling: int, reward: float = 1.0, version: int = 0) -> RolloutRow:
    return RolloutRow(
        group_id=group_id,
        sibling=sibling,
        attempt=0,
        segments=[
            Segment(kind="prompt", token_ids=[1, 2]),
            Segment(kind="policy", token_ids=[3, 4], logprobs=[-0.1, -0.2], policy_version=version),
        ],
        reward=reward,
        num_turns=1,
    )


def test_duplicate_delivery_of_a_sibling_is_ignored():
    plane = DataPlane()
    assert plane.put(make_row("g1", 0, reward=1.0))
    assert not plane.put(make_row("g1", 0, reward=0.0))
    assert [row.reward for row in plane.rows("g1")] == [1.0]


def test_rows_come_back_in_sibling_order_and_delete_removes_groups():
    plane = DataPlane()
    for sibling in (2, 0, 1):
        plane.put(make_row("g1", sibling))
    plane.put(make_row("g2", 0))
    assert [row.sibling for row in plane.rows("g1")] == [0, 1, 2]
    assert plane.num_rows() == 4
    plane.delete(["g1"])
    assert plane.group_ids() == ["g2"]
    assert plane.sealed_count("g1") == 0


def test_state_dict_round_trip_keeps_every_row():
    plane = DataPlane()
    plane.put(make_row("g1", 0, version=3))
    plane.put(make_row("g1", 1, version=4))
    restored = DataPlane()
    restored.load_state_dict(plane.state_dict())
    assert restored.rows("g1") == plane.rows("g1")
    assert restored.rows("g1")[1].policy_versions() == [4]
