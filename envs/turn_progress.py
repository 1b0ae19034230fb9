"""A streaming turn's tokens, reported in chunks while they come: to the turn journal at the `token`
level (a crash mid-turn then loses at most one chunk) and to a listener (the audit log's progress).

A chunk is written once `every_tokens` tokens are pending or `every_s` has passed since the last
one, whichever comes first; the journal's own batching makes it durable (a chunk is one record: a
kill tears at most the last, and the reader drops a torn record whole).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from turnkeep.envs.streamed_turn import StreamedTurn
from turnkeep.envs.turn_journal import TurnJournal
from turnkeep.schemas.policy import CompletionRequest
from turnkeep.schemas.rollout import Segment

ChunkListener = Callable[[int, int, int], None]
"""Told of each chunk: (turns completed before this one, tokens of this turn so far, newest policy version)."""


class TurnProgress:
    def __init__(self, call: CompletionRequest, partial: Segment | None, rollout_id: str, after_turn: int,
                 every_tokens: int, every_s: float, journal: TurnJournal | None = None,
                 on_chunk: ChunkListener | None = None) -> None:
        """The turn of `call` (continuing `partial`, a crashed turn's tokens), streamed into `self.turn`, which tells
        this object of each run of tokens."""
        self.turn = self._turn = StreamedTurn(call, partial, on_tokens=self.tokens_arrived)
        self._rollout_id = rollout_id
        self._after_turn = after_turn
        self._every_tokens = every_tokens
        self._every_s = every_s
        self._journal = journal
        self._on_chunk = on_chunk
        self._written = 0
        self._last = time.monotonic()
        if self.turn.token_ids:
            self.flush()  # a continued turn's carried tokens: its new rollout id keeps them from the start

    def tokens_arrived(self, _ids: list[int], _logprobs: list[float], _version: int) -> None:
        pending = len(self._turn.token_ids) - self._written
        if pending >= self._every_tokens or time.monotonic() - self._last >= self._every_s:
            self.flush()

    def flush(self) -> None:
        turn, start = self._turn, self._written
        if len(turn.token_ids) == start:
            return
        if self._journal is not None:
            self._journal.partial(self._rollout_id, self._after_turn, start, turn.token_ids[start:],
                                  turn.logprobs[start:], turn.versions[start:])
        if self._on_chunk is not None:
            self._on_chunk(self._after_turn, len(turn.token_ids), max(turn.versions))
        self._written = len(turn.token_ids)
        self._last = time.monotonic()
