"""The trainer's ranks as one group: rank 0 in the trainer's own process, ranks 1..N-1 in Ray actors
(`gpu_workers.rank_actor.TrainerRankActor`).

Every call goes to all ranks at once (their collectives meet), and the group answers only when every rank has:
a rank that fails fails the call, naming the rank. With several ranks, calls run one at a time (a checkpoint
asked for while a step computes waits for its backward pass): two calls' collectives must never interleave.
A step's rows are split between the ranks by group, whole groups to one rank, so that each rank's row count is as
even as groups allow.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import psutil

from turnkeep.gpu_workers.grpo import PackedBatch
from turnkeep.gpu_workers.rank_compute import RankCompute

INIT_TIMEOUT = timedelta(minutes=5)
"""How long a rank waits for the others to join the group (a model load on each comes first)."""


BROKEN_GRACE_S = 10.0
"""After one rank's call failed, how long the others get to answer before the group counts as broken."""


class RankFailed(RuntimeError):
    """A trainer rank's call failed; the group cannot go on without it. `probe`: what caught a hang."""

    def __init__(self, message: str, rank: int = 0, cause: BaseException | None = None,
                 probe: str = "collective timeout") -> None:
        super().__init__(message)
        self.rank, self.cause, self.probe = rank, cause, probe


class RankGroup:
    def __init__(self, local: RankCompute, followers: Sequence[Any] = (),
                 on_broken: Callable[[RankFailed], None] | None = None, hang_s: float = 300.0) -> None:
        """`on_broken`: called with the failure when a call failed on a rank and another rank never answered (the
        group cannot go on: its collectives would wait for that rank), or when a rank has not answered `hang_s`
        (`train.hang_s`) after another rank did; the trainer's process leaves for the run to rebuild the group. A
        call that failed on ranks that all answered raises, as before."""
        self.local = local
        self.followers = list(followers)
        self.hang_s = hang_s
        self._one_at_a_time = asyncio.Lock() if self.followers else None
        self.on_broken = on_broken

    @property
    def size(self) -> int:
        return 1 + len(self.followers)

    async def all(self, method: str, per_rank: Sequence[tuple] | None = None) -> list:
        """`method` on every rank at once with its own arguments (the same empty ones by default); each rank's
        result, rank 0 first."""
        if self._one_at_a_time is None:
            return [await asyncio.to_thread(getattr(self.local, method), *(per_rank[0] if per_rank else ()))]
        async with self._one_at_a_time:
            return await self._on_every_rank(method, per_rank)

    async def _on_every_rank(self, method: str, per_rank: Sequence[tuple] | None) -> list:
        args = list(per_rank) if per_rank is not None else [()] * self.size
        calls = [asyncio.ensure_future(asyncio.to_thread(getattr(self.local, method), *args[0]))]
        calls += [asyncio.ensure_future(follower.call.remote(method, *args[rank]))
                  for rank, follower in enumerate(self.followers, 1)]
        # A frozen rank's call never returns, while the others' collectives time out waiting for it
        # (`train.hang_s`): a failure waits BROKEN_GRACE_S for the other ranks, not for ever. A call without
        # collectives (the shard copies) times out nowhere: once one rank answered, the others get `hang_s`.
        _, pending = await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
        if pending and not _failed(calls):
            _, pending = await asyncio.wait(pending, timeout=self.hang_s, return_when=asyncio.FIRST_EXCEPTION)
        if pending and _failed(calls):
            _, pending = await asyncio.wait(pending, timeout=BROKEN_GRACE_S)
        for rank, call in enumerate(calls):
            if call.done() and call.exception() is not None:
                failure = call.exception()
                failed = RankFailed(f"trainer rank {rank} of {self.size} failed in {method}: "
                                    f"{type(failure).__name__}: {failure}", rank, failure)
                self._broken_if(pending, failed)
                raise failed from failure
        if pending:
            rank = calls.index(next(iter(pending)))
            failed = RankFailed(f"trainer rank {rank} of {self.size} did not answer {method} within train.hang_s = "
                                f"{self.hang_s:g}s of the other ranks (frozen?)", rank, probe="no answer")
            self._broken_if(pending, failed)
            raise failed
        return [call.result() for call in calls]

    def _broken_if(self, pending, failed: RankFailed) -> None:
        if pending and self.on_broken is not None:
            self.on_broken(failed)  # a rank that never answered: the group cannot go on


def _failed(calls: list) -> bool:
    return any(call.done() and call.exception() is not None for call in calls)


def split_by_group(batch: PackedBatch, ranks: int) -> list[PackedBatch | None]:
    """`ranks` shares of a batch whose rows are ordered by group: whole groups, contiguous, each share near an even
    row count; a share with no rows is None (more ranks than groups)."""
    starts = [i for i, group in enumerate(batch.group_ids) if i == 0 or group != batch.group_ids[i - 1]]
    rows = len(batch.group_ids)
    cuts = [0]
    for rank in range(1, ranks):
        wanted = rank * rows / ranks
        later = [s for s in starts if s > cuts[-1]]
        cuts.append(min(later, key=lambda s: abs(s - wanted)) if later else rows)
    cuts.append(rows)
    return [batch.rows(a, b) if b > a else None for a, b in zip(cuts, cuts[1:])]


def micro_batch_count(shares: Sequence[PackedBatch | None], micro_batch_rows: int | None) -> int:
    """Forward/backward passes every rank makes: enough for the largest share at `micro_batch_rows` rows each."""
    largest = max((len(s.group_ids) for s in shares if s is not None), default=1)
    return math.ceil(largest / micro_batch_rows) if micro_batch_rows else 1


def open_rendezvous(host: str) -> tuple[socket.socket, str]:
    """Rank 0's listening socket for the group's store, on `host` only, and the `tcp://` address the other ranks
    join at. Held open from here on, so no other process can take its port in between."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen(128)
    return listener, f"tcp://{host}:{listener.getsockname()[1]}"


def join_group(address: str, rank: int, ranks: int, device_type: str, own_ip: str,
               listener: socket.socket | None = None, hang_s: float | None = None) -> None:
    """Join the trainer's torch.distributed group (NCCL on CUDA, gloo on the CPU); blocks until every rank has.
    Rank 0 serves the group's store on `listener`. A collective that waits `hang_s` for a rank (`train.hang_s`;
    None: INIT_TIMEOUT) fails on the ranks that wait, so a frozen rank is noticed as a dead one is. Gloo listens
    on the interface that holds `own_ip` (this node's address in Ray): a run on loopback stays on loopback (left
    to themselves, the store and gloo listen on every interface)."""
    import torch.distributed as dist  # torch only in the trainer ranks

    if interface := interface_of(own_ip):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    if listener is not None:
        store = dist.TCPStore(host, int(port), ranks, is_master=True, timeout=INIT_TIMEOUT,
                              master_listen_fd=listener.fileno(), use_libuv=False)
    else:
        store = dist.TCPStore(host, int(port), ranks, is_master=False, timeout=INIT_TIMEOUT)
    backend = "nccl" if device_type == "cuda" else "gloo"
    timeout = timedelta(seconds=hang_s) if hang_s is not None else INIT_TIMEOUT
    dist.init_process_group(backend, store=store, rank=rank, world_size=ranks, timeout=timeout)


def interface_of(ip: str) -> str | None:
    """The name of the network interface that holds `ip` (None when none does)."""

    for name, addresses in psutil.net_if_addrs().items():
        if any(address.address == ip for address in addresses):
            return name
    return None
