"""An environment server's journal of committed turn boundaries, so an agent survives a crash without parking.

Each commit appends one record: the segments the turn added (the whole conversation for a
rollout's first boundary, with its request), its environment's exported state at that
boundary, and whether the episode ended there. Records reach the disk in batches every
`flush_every_s`: a boundary lost to a crash costs only that turn, generated again.

A restore asks for the agents the restored controller state still has running, each with
the newest policy version the restored trainer knows and the incarnation that started
it: `newest_boundaries` rebuilds each one's newest boundary that this incarnation
journaled and whose turns all came from such a version. Within one incarnation policy
versions only grow, so that is exactly the restored lineage: no turn of a policy the
restore rolled back is ever continued, and a rollout id that an abandoned lineage used
as well (ids repeat, since the dataloader admits the same prompts again) never matches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from turnkeep.primitives.segment_format import LogPosition, list_segments
from turnkeep.primitives.segment_log import SegmentLog
from turnkeep.primitives.segment_reader import oldest_position, prune_before, read_records
from turnkeep.schemas.participant import RunningAgent, SavedAgent
from turnkeep.schemas.rollout import RolloutRequest, Segment, TurnBoundary

log = logging.getLogger("turnkeep.env")


class PartialDurable(NamedTuple):
    """A partial turn's tokens made durable by a sync."""

    rollout_id: str
    started_by: int
    turn: int
    """Turns completed before the one being generated."""
    tokens: int
    """Tokens of that turn in the journal so far."""
    policy_version: int
    """The newest version among them."""


class TurnJournal:
    def __init__(self, directory: Path, log_id: str, *, segment_bytes: int = 64 << 20,
                 before_sync: Callable[[], None] | None = None,
                 tokens_durable: Callable[[list[PartialDurable]], None] | None = None) -> None:
        self.directory = Path(directory)
        self.log_id = log_id
        self._log = SegmentLog(self.directory, log_id, segment_bytes=segment_bytes)
        self._journaled: dict[str, int] = {}
        """Rollout id -> segments of its conversation already in the journal."""
        self._started_by: dict[str, int] = {}
        """Rollout id -> the incarnation that started it (its request's)."""
        self._partials: list[tuple[int, PartialDurable]] = []
        """(seq after, what it makes durable) of the chunks not yet durable."""
        self.tokens_durable = tokens_durable
        """Told after each sync of the partial turns that became durable."""
        self.before_sync = before_sync
        """Runs before every sync (the server's audit-log flush): a turn the journal keeps is then always in the
        audit log too, so the invariant checker can verify every continuation against what was generated."""

    def committed(self, request: RolloutRequest, boundary: TurnBoundary, env_state: dict[str, Any] | None,
                  done: bool) -> int:
        """Append the boundary; returns the journal position after it."""
        rollout_id = boundary.rollout_id
        known = self._journaled.get(rollout_id)
        record = {
            "rid": rollout_id, "turn": boundary.turn_index, "from": known or 0,
            "new": [s.model_dump() for s in boundary.segments[known or 0:]],
            "env_state": env_state, "done": done,
            "request": request.model_dump() if known is None else None,
        }
        self._journaled[rollout_id] = len(boundary.segments)
        self._started_by[rollout_id] = request.incarnation
        return self._log.append(orjson.dumps(record))

    def partial(self, rollout_id: str, turn_index: int, start: int, token_ids: list[int], logprobs: list[float],
                versions: list[int]) -> int | None:
        """Append tokens `start..` of the turn after boundary `turn_index`, as they streamed in; returns the journal
        position after them, or None when the rollout's conversation is not in the journal (nothing to attach
        them to: its first boundary carries its request)."""
        if rollout_id not in self._journaled:
            return None
        record = {"rid": rollout_id, "turn": turn_index, "partial_from": start, "ids": token_ids, "lps": logprobs,
                  "vs": versions}
        seq = self._log.append(orjson.dumps(record))
        self._partials.append((seq, PartialDurable(rollout_id, self._started_by[rollout_id], turn_index,
                                                   start + len(token_ids), max(versions, default=0))))
        return seq

    def forget(self, rollout_id: str) -> None:
        """The rollout ended here: its next boundary (a new attempt) starts a new conversation."""
        self._journaled.pop(rollout_id, None)
        self._started_by.pop(rollout_id, None)

    def position(self) -> LogPosition:
        return self._log.position()

    async def sync(self) -> LogPosition:
        if self.before_sync is not None:
            self.before_sync()
        end = await self._log.sync()
        durable = [p for p in self._partials if p[0] <= end.seq]
        if durable:
            self._partials = self._partials[len(durable):]
            if self.tokens_durable is not None:
                self.tokens_durable([p[1] for p in durable])
        return end

    async def flush_forever(self, every_s: float, keep_bytes: int = 256 << 20) -> None:
        """Make the boundaries durable in batches, and keep about `keep_bytes` of the newest segments, until
        cancelled. Pruning is always safe: a rollout whose first record is gone is not continued, it starts over."""
        while True:
            await asyncio.sleep(every_s)
            if self._log.durable_seq < self._log.position().seq:
                await self.sync()
                self.prune_to(keep_bytes)

    def prune_to(self, keep_bytes: int) -> list[Path]:
        segments = list_segments(self.directory)
        kept, cut_at = 0, None
        for first, path in reversed(segments):
            kept += path.stat().st_size
            if kept > keep_bytes:
                cut_at = first
                break
        if cut_at is None:
            return []
        later = [first for first, _ in segments if first > cut_at]
        return prune_before(self.directory, later[0]) if later else []

    def close(self) -> None:
        self._log.close()


class _Newest:
    """One wanted rollout's conversation as the records rebuild it, and its newest boundary that qualifies."""

    def __init__(self, wanted: RunningAgent) -> None:
        self.max_version = wanted.max_version
        self.incarnation = wanted.incarnation
        self.request: dict | None = None
        self.following = False
        """The records being read belong to the wanted incarnation's conversation."""
        self.segments: list[dict] = []
        self.newest_version = -1
        self.best: tuple[int, int, dict | None, bool] | None = None
        """(turn index, segments, env state, done) of the newest boundary within max_version."""
        self.partial = _Partial(-1)
        """Tokens journaled of the turn after the newest boundary read so far."""

    def _add_partial(self, record: dict) -> None:
        partial = self.partial
        if not self.following or record["turn"] != partial.after_turn or record["partial_from"] != len(partial.ids):
            return  # another conversation's, or after a chunk lost to a crash: the turn goes on from what is whole
        if partial.stopped:
            return
        for token, logprob, version in zip(record["ids"], record["lps"], record["vs"], strict=True):
            if version > self.max_version:
                partial.stopped = True  # a policy the restore rolled back generated the rest
                return
            partial.ids.append(token)
            partial.logprobs.append(logprob)
            partial.versions.append(version)

    def add(self, record: dict) -> None:
        if "partial_from" in record:
            self._add_partial(record)
            return
        if record["request"] is not None:
            # Another lineage's conversation under the same id is skipped, and leaves ours as it was.
            self.following = record["request"].get("incarnation", 0) == self.incarnation
            if self.following:
                self.request, self.segments, self.newest_version, self.best = record["request"], [], -1, None
        if not self.following or record["from"] != len(self.segments):
            return  # a record of a conversation whose start was pruned or lost: nothing to rebuild from
        self.segments.extend(record["new"])
        self.partial = _Partial(record["turn"])
        versions = [s["policy_version"] for s in record["new"] if s.get("policy_version") is not None]
        self.newest_version = max([self.newest_version, *versions])
        if self.newest_version <= self.max_version:
            self.best = (record["turn"], len(self.segments), record["env_state"], record["done"])

    def saved(self, rollout_id: str) -> SavedAgent | None:
        if self.best is None or self.request is None:
            return None
        turn, count, env_state, done = self.best
        boundary = TurnBoundary(rollout_id=rollout_id, turn_index=turn, done=done,
                                segments=[Segment.model_validate(s) for s in self.segments[:count]])
        # Only the turn after the kept boundary continues: one after a newer boundary belongs to a rolled-back policy.
        partial = self.partial.segment() if self.partial.after_turn == turn and not done else None
        return SavedAgent(request=RolloutRequest.model_validate(self.request), boundary=boundary,
                          env_state=env_state, partial=partial)


class _Partial:
    def __init__(self, after_turn: int) -> None:
        self.after_turn = after_turn
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.stopped = False

    def segment(self) -> Segment | None:
        return Segment.policy_turn(self.ids, self.logprobs, self.versions) if self.ids else None


def newest_boundaries(directory: Path, log_id: str, wanted: dict[str, RunningAgent], end: LogPosition,
                      ) -> dict[str, SavedAgent]:
    """For each wanted rollout id, its newest boundary in the journal up to `end` that the wanted incarnation
    journaled, with turns only from policy versions up to the wanted one; rollouts with none are left out (they
    start over)."""
    start = oldest_position(directory, log_id)
    if start is None or not wanted:
        return {}
    found = {rollout_id: _Newest(agent) for rollout_id, agent in wanted.items()}
    for payload in read_records(directory, log_id, start, end):
        record = orjson.loads(payload)
        newest = found.get(record["rid"])
        if newest is not None:
            newest.add(record)
    return {rid: saved for rid, newest in found.items() if (saved := newest.saved(rid)) is not None}
