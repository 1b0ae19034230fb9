"""Redundant copies of the trainer ranks' shards (`train.rank_copies`), so that a dead trainer or rank is rebuilt
at the step it reached instead of the newest checkpoint's.

After every train step each rank pushes its shard (`gpu_workers.shard_state`) to two keepers
(`gpu_workers.shard_keeper`): its own, on its node, and the next rank's, on the next rank's node (with one rank,
only its own). A rebuilt group asks every keeper still alive what it holds, takes the newest step of which every
rank's shard has a copy somewhere, and each new rank loads its own shard from one of its two holders.

Why not torchft: it heals a replica group from another replica (HSDP), behind a lighthouse service; inside one
FSDP group no other replica holds a rank's shard, which is what the keepers add.
"""

from __future__ import annotations

import logging

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from turnkeep.gpu_workers.shard_keeper import ShardKeeper
from turnkeep.schemas.names import shard_keeper_name

log = logging.getLogger("turnkeep.trainer")
PUT_TIMEOUT_S = 120.0
"""A keeper that takes longer to accept a shard is counted as lost for this step (the step goes on)."""


LOST = (ValueError, TimeoutError, ray.exceptions.RayError)
"""A keeper never started (no actor of its name), dead, or not answering within PUT_TIMEOUT_S."""


def _wait(ref):
    """The call's result, from the rank's thread (a blocking `ray.get` would be taken for one on the actor's event
    loop)."""
    return ref.future().result(timeout=PUT_TIMEOUT_S)


def holders_of(rank: int, ranks: int) -> list[int]:
    """The keepers that hold `rank`'s shard: its own and the next rank's."""
    return sorted({rank, (rank + 1) % ranks})


def complete_step(held: dict[int, dict[int, list[int]]], ranks: int) -> tuple[int | None, str]:
    """`held`: each keeper that answered -> rank -> the steps it holds of that rank's shard. The newest step every
    rank's shard has a copy of, or None and why none has."""
    steps = {rank: set() for rank in range(ranks)}
    for by_rank in held.values():
        for rank, kept in by_rank.items():
            if int(rank) in steps:
                steps[int(rank)].update(kept)
    common = set.intersection(*steps.values())
    if common:
        return max(common), ""
    lost = [rank for rank, kept in steps.items() if not kept]
    if lost:
        gone = sorted({k for rank in lost for k in holders_of(rank, ranks)} - set(held))
        return None, (f"no copy of rank(s) {lost}'s shard is left (held by keepers {gone}, which are gone: their "
                      "nodes or processes died together)")
    return None, f"the ranks' copies are of different steps ({ {r: sorted(s) for r, s in steps.items()} })"


def _on_every_keeper(ranks: int, method: str, *args) -> dict[int, object]:
    """Keeper -> what `method` answered, for every keeper of a `ranks`-rank trainer that still answers."""
    answers = {}
    for keeper in range(ranks):
        try:
            answers[keeper] = _wait(getattr(ray.get_actor(shard_keeper_name(keeper)), method).remote(*args))
        except LOST:  # never started, or dead
            continue
    return answers


def newest_complete_step(ranks: int) -> tuple[int | None, str]:
    """`complete_step` over what every keeper that still answers holds."""
    return complete_step(_on_every_keeper(ranks, "held"), ranks)


def forget_copies(ranks: int) -> None:
    """Every keeper drops its copies (the trainer loaded a checkpoint: they are of steps the run no longer follows)."""
    _on_every_keeper(ranks, "forget")


class CopySink:
    """One rank's way to its keepers, from the process that hosts the rank: starts its own keeper on its node (or
    finds the one a dead rank of the same number left), pushes the rank's shard after each step, fetches it back
    into a rebuilt rank."""

    def __init__(self, rank: int, ranks: int, detached: bool) -> None:
        """`detached`: the keeper outlives this process and the controller (the run's processes do)."""
        self.rank, self.ranks, self._detached = rank, ranks, detached
        self._own = self._start_own()
        self._lost: set[int] = set()

    def _start_own(self):
        node = ray.get_runtime_context().get_node_id()
        options = {"lifetime": "detached"} if self._detached else {}
        # On this node and nowhere else: a keeper elsewhere (Ray spills a soft placement when the node's workers
        # are busy) would be lost with a node that holds none of this rank's, and stall its pushes until then.
        return ShardKeeper.options(name=shard_keeper_name(self.rank), get_if_exists=True, **options,
                                   scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()

    def _keeper(self, keeper: int):
        return self._own if keeper == self.rank else ray.get_actor(shard_keeper_name(keeper))

    def push(self, step: int, blob: bytes) -> str | None:
        """The shard as of `step` to both its holders; a holder that is gone is named (None: both have it)."""
        shard = ray.put(blob)  # one copy in the object store, read by both keepers
        problems = []
        for keeper in holders_of(self.rank, self.ranks):
            try:
                _wait(self._keeper(keeper).put.remote(self.rank, step, shard))
                self._lost.discard(keeper)
            except LOST as err:
                problems.append(f"keeper {keeper}: {type(err).__name__}")
                if keeper == self.rank:
                    self._own = self._start_own()  # its node is this one: a new keeper takes the next step's copy
                if keeper not in self._lost:
                    log.warning("rank %d's shard copy of step %d did not reach keeper %d (%s); until it does, that "
                                "copy is missing", self.rank, step, keeper, str(err).splitlines()[0][:200])
                    self._lost.add(keeper)
        return "; ".join(problems) or None

    def fetch(self, step: int) -> bytes:
        """The shard as of `step` from the first of its holders that has it."""
        for keeper in holders_of(self.rank, self.ranks):
            try:
                blob = _wait(self._keeper(keeper).get.remote(self.rank, step))
            except LOST:
                continue
            if blob is not None:
                return blob
        raise RuntimeError(f"no keeper holds rank {self.rank}'s shard copy of step {step} any more")

    def commit(self, step: int) -> None:
        """Every rank's copy of `step` arrived: the keepers drop the older ones."""
        _on_every_keeper(self.ranks, "commit", step)
