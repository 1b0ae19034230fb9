"""Two trainer ranks in real processes (the trainer's and a `TrainerRankActor`, a gloo group on the CPU, the model
sharded with FSDP2) train as one rank does; their sharded checkpoints restore at the other size; a hold keeps
every rank from stepping; a damaged shard is named and its checkpoint skipped. Both trainers have a KL term against a
reference (`algorithm.kl_coef`), sharded over the two ranks like the policy and reloaded, not restored.

Tolerance: the two ranks' gradients are summed by a reduce-scatter, the one rank's in one backward pass: the same
float32 terms added in another order, about 1e-7 apart relative to the terms. AdamW moves each weight by about
`lr` (1e-4) per step whatever the gradient's size, so a few steps leave the weights at most ~1e-8 apart; 1e-6
absolute is a bound that a wrong split (a share counted twice, a missing one, a mean instead of a sum) breaks by
orders of magnitude. A checkpoint round trip moves bits, not sums: there the weights must be equal."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load as load_safetensors

from turnkeep.controller.restore.restore_source import SourceKind, choose_source
from turnkeep.controller.stores.trainer_checkpoint import CheckpointIdentity, write_trainer_checkpoint
from turnkeep.schemas.rollout import RolloutRow, Segment

pytestmark = pytest.mark.integration
ATOL = 1e-6


def _rows(seed: int, groups: int = 4) -> list[dict]:
    rows = []
    for i in range(groups * 2):
        width = 20 + (seed + i) % 5
        rows.append(RolloutRow(
            group_id=f"s{seed}g{i // 2}", sibling=i % 2, attempt=0, reward=float((i + seed) % 2), num_turns=1,
            segments=[Segment(kind="prompt", token_ids=[1] + [3 + (i + t + seed) % 20 for t in range(7)]),
                      Segment(kind="policy", token_ids=[3 + (i * t + seed) % 20 for t in range(width - 8)],
                              logprobs=[-1.5] * (width - 8), policy_version=0)],
        ).model_dump())
    return rows


@pytest.fixture(scope="module")
def trainers(stack, stack_config):
    from turnkeep.gpu_workers.trainer_actor import TrainerActor

    actors = {}
    for ranks in (1, 2):
        cfg = stack_config.model_copy(update={"train": stack_config.train.model_copy(update={"ranks": ranks}),
                                              "algorithm": stack_config.algorithm.model_copy(update={"kl_coef": 0.05})})
        actor = TrainerActor.options(num_gpus=0).remote()
        ray.get(actor.setup.remote(str(stack.model_dir), cfg.model_dump_json()))
        actors[ranks] = actor
    yield actors
    for actor in actors.values():
        ray.kill(actor)


def weights(trainer) -> dict[str, torch.Tensor]:
    """The whole model as the engines get it: gathered from every rank."""
    return load_safetensors(ray.get(trainer.weights_blob.remote()))


def step(trainer, rows: list[dict]) -> dict:
    return ray.get(trainer.train_step.remote(rows, ray.get(trainer.version.remote()) + 1))


def assert_weights(left: dict, right: dict, atol: float) -> None:
    assert left.keys() == right.keys()
    for name, tensor in left.items():
        torch.testing.assert_close(right[name], tensor, rtol=0, atol=atol, msg=name)


def test_two_ranks_train_as_one_and_restore_each_others_checkpoints(trainers, tmp_path: Path):
    one, two = trainers[1], trainers[2]
    first = _rows(1)
    by_one, by_two = step(one, first), step(two, first)
    assert (by_one["ranks"], by_two["ranks"]) == (1, 2)
    for key in ("loss", "grad_norm", "tokens"):
        assert by_two[key] == pytest.approx(by_one[key], rel=1e-5), key
    assert_weights(weights(one), weights(two), ATOL)

    # 2 -> 1: the two-rank trainer goes a step ahead alone, and the one rank loads its shards.
    step(two, _rows(2))
    ray.get(two.save_checkpoint.remote(str(tmp_path / "by_two")))
    assert sorted(p.name for p in (tmp_path / "by_two" / "shards").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert ray.get(one.load_checkpoint.remote(str(tmp_path / "by_two"), 2)) == 2
    assert_weights(weights(two), weights(one), atol=0)
    third = _rows(3)
    by_one, by_two = step(one, third), step(two, third)  # the AdamW moments came along: the next step agrees too
    assert_weights(weights(one), weights(two), ATOL)
    assert by_one["kl_reference"] > 0 and by_two["kl_reference"] == pytest.approx(by_one["kl_reference"], rel=1e-4)

    # 1 -> 2: now the one rank goes ahead, and the two ranks load its checkpoint.
    step(one, _rows(4))
    ray.get(one.save_checkpoint.remote(str(tmp_path / "by_one")))
    assert ray.get(two.load_checkpoint.remote(str(tmp_path / "by_one"), 4)) == 4
    assert_weights(weights(one), weights(two), atol=0)
    fifth = _rows(5)
    step(one, fifth), step(two, fifth)
    assert_weights(weights(one), weights(two), ATOL)


def test_a_hold_keeps_every_rank_from_stepping_and_a_damaged_shard_is_skipped(trainers, tmp_path: Path):
    two = trainers[2]
    version = ray.get(two.version.remote())
    before = weights(two)
    assert ray.get(two.hold_add.remote("snapshot:test", 600.0))
    stepping = two.train_step.remote(_rows(6), version + 1)
    deadline = time.monotonic() + 120
    while not ray.get(two.waiting_on_hold.remote()):
        assert time.monotonic() < deadline, "the step never reached the hold"
        time.sleep(0.05)
    assert_weights(before, weights(two), atol=0)  # gathered from both ranks: neither stepped
    assert ray.get(two.hold_release.remote("snapshot:test"))
    assert ray.get(stepping)["policy_version"] == version + 1
    assert any(not torch.equal(before[name], tensor) for name, tensor in weights(two).items())

    fields = {"test": "ranks"}
    identity = CheckpointIdentity(run_id="run-ranks", fingerprint_fields=fields)
    older = _run_checkpoint(tmp_path, version + 1, two, identity)
    step(two, _rows(7))
    newest = _run_checkpoint(tmp_path, version + 2, two, identity)
    shard = newest / "trainer" / "shards" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))

    source = choose_source(tmp_path, "run-ranks", fields)
    assert (source.kind, source.step) == (SourceKind.TRAINER_CHECKPOINT, version + 1)
    assert Path(source.checkpoint_dir) == older.absolute()
    assert [s.problem for s in source.skipped] == ["digest_mismatch"]
    assert "trainer/shards/__1_0.distcp" in source.skipped[0].detail


def _run_checkpoint(run_dir: Path, step_number: int, trainer, identity: CheckpointIdentity) -> Path:
    import asyncio

    return asyncio.run(write_trainer_checkpoint(run_dir, step_number, trainer, {"step": step_number}, 3,
                                                identity=identity))


def _copying_trainer(stack, stack_config):
    """A two-rank trainer with `train.rank_copies` on, its keepers detached (as a run's are)."""
    from turnkeep.gpu_workers.trainer_actor import TrainerActor

    cfg = stack_config.model_copy(update={"train": stack_config.train.model_copy(
        update={"ranks": 2, "rank_copies": True})})
    actor = TrainerActor.options(num_gpus=0).remote()
    ray.get(actor.setup.remote(str(stack.model_dir), cfg.model_dump_json(), None, True))
    return actor


def _keepers_hold() -> dict:
    from turnkeep.schemas.names import shard_keeper_name

    return {k: ray.get(ray.get_actor(shard_keeper_name(k)).held.remote()) for k in range(2)}


def test_a_group_rebuilt_after_a_rank_death_loads_the_ranks_copies_at_the_step_the_dead_one_reached(
        stack, stack_config, tmp_path: Path):
    import os
    import signal

    from turnkeep.schemas.names import shard_keeper_name

    first = _copying_trainer(stack, stack_config)
    step(first, _rows(11))
    stats = step(first, _rows(12))
    assert stats["copy_s"] > 0
    assert _keepers_hold() == {0: {0: [2], 1: [2]}, 1: {0: [2], 1: [2]}}  # two ranks: each keeper holds both
    reached = weights(first)
    ray.get(first.save_checkpoint.remote(str(tmp_path / "step2")))
    [rank1] = ray.get(first.ranks.remote())
    os.kill(rank1, signal.SIGKILL)  # the group cannot go on: the trainer's process exits with it
    deadline = time.monotonic() + 60
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < deadline:
            ray.get(first.version.remote())
            time.sleep(0.2)

    second = _copying_trainer(stack, stack_config)
    assert ray.get(second.restore_copies.remote()) == {"step": 2, "groups": ["s12g0", "s12g1", "s12g2", "s12g3"]}
    progress = ray.get(second.progress.remote())
    assert (progress["version"], progress["from_copies"], progress["last_step"]["step"]) == (2, True, 2)
    assert_weights(reached, weights(second), atol=0)
    after_copies = step(second, _rows(13))
    moved_from_copies = weights(second)
    assert ray.get(second.progress.remote())["from_copies"] is False

    # The same step from the checkpoint of step 2 (weights, AdamW moments, RNG): the copies had all of them.
    assert ray.get(second.load_checkpoint.remote(str(tmp_path / "step2"), 2)) == 2
    assert _keepers_hold() == {0: {}, 1: {}}  # copies of steps past a loaded checkpoint are dropped
    after_checkpoint = step(second, _rows(13))
    assert after_copies["loss"] == pytest.approx(after_checkpoint["loss"], rel=1e-6)
    assert_weights(moved_from_copies, weights(second), ATOL)

    # Both keepers gone together (both nodes lost): no copy is left, and the restore says so.
    for keeper in range(2):
        ray.kill(ray.get_actor(shard_keeper_name(keeper)), no_restart=True)
    time.sleep(1.0)
    why = ray.get(second.restore_copies.remote())["why"]
    assert why.startswith("no copy of rank(s) [0, 1]'s shard is left (held by keepers [0, 1], which are gone"), why
    step(second, _rows(14))  # a step with its keepers gone trains, its copies missing, and starts new keepers
    assert step(second, _rows(15))["policy_version"] == 5
    assert _keepers_hold() == {0: {0: [5], 1: [5]}, 1: {0: [5], 1: [5]}}
    ray.kill(second)
    for keeper in range(2):
        ray.kill(ray.get_actor(shard_keeper_name(keeper)), no_restart=True)
