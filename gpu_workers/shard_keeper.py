"""The process beside a trainer rank that keeps shard copies in its host memory: keeper r holds rank r's own shard
and the previous rank's (`gpu_workers.rank_copies.holders_of`), each as of a train step.

It is a Ray actor of its own, not the rank's process, because a rank's death takes the whole trainer group with
it (the group's collectives cannot go on, and ranks 1..N-1 are owned by rank 0's process): a copy in a rank's
own memory would die with the group it is meant to rebuild. The keeper lives on the rank's node, so losing that
node loses the rank's own copy and the previous rank's, and each of those shards is still held by one other
keeper.

A step's copies arrive one rank at a time; the step counts as copied only once every rank's has arrived (the
trainer then `commit`s it), so until then the previous step's are kept beside them.
"""

from __future__ import annotations

import os

import ray


class ShardCopies:
    """What a keeper holds: rank -> step -> that rank's shard as of that step."""

    def __init__(self) -> None:
        self._copies: dict[int, dict[int, bytes]] = {}

    def put(self, rank: int, step: int, blob: bytes) -> None:
        kept = self._copies.setdefault(rank, {})
        kept[step] = blob
        for older in sorted(kept)[:-2]:  # a step's and its predecessor's, until the trainer commits one
            del kept[older]

    def commit(self, step: int) -> None:
        """Every rank's copy of `step` has arrived at its keepers: older ones go."""
        for kept in self._copies.values():
            for older in [s for s in kept if s < step]:
                del kept[older]

    def held(self) -> dict[int, list[int]]:
        """Rank -> the steps whose copy of that rank's shard is held here."""
        return {rank: sorted(kept) for rank, kept in self._copies.items() if kept}

    def get(self, rank: int, step: int) -> bytes | None:
        return self._copies.get(rank, {}).get(step)

    def forget(self) -> None:
        self._copies.clear()

    def held_bytes(self) -> int:
        return sum(len(blob) for kept in self._copies.values() for blob in kept.values())


@ray.remote(num_cpus=0)
class ShardKeeper:
    def __init__(self) -> None:
        self._copies = ShardCopies()

    async def put(self, rank: int, step: int, blob: bytes) -> None:
        self._copies.put(rank, step, blob)

    async def commit(self, step: int) -> None:
        self._copies.commit(step)

    async def held(self) -> dict[int, list[int]]:
        return self._copies.held()

    async def get(self, rank: int, step: int) -> bytes | None:
        return self._copies.get(rank, step)

    async def forget(self) -> None:
        """The trainer loaded a checkpoint: the copies belong to a line of steps the run no longer follows."""
        self._copies.forget()

    async def pid(self) -> int:
        return os.getpid()

    async def held_bytes(self) -> int:
        return self._copies.held_bytes()
