"""The `token` level's pieces: a turn's tokens journaled in chunks while they stream, replayed into the turn a
restore continues (whole chunks only, never a torn one, never one of a rolled-back policy), and a turn that a
newer policy finished keeps each token's own version."""

from __future__ import annotations

import asyncio

import pytest

from tests.envs.test_turn_journal import LOG_ID, commit_turns, conversation, request, want
from turnkeep.envs.streamed_turn import StreamedTurn
from turnkeep.envs.turn_journal import TurnJournal, newest_boundaries
from turnkeep.envs.turn_progress import TurnProgress
from turnkeep.envs.turn_records import TurnRecords
from turnkeep.gpu_workers.grpo import build_batch
from turnkeep.primitives.segment_format import list_segments
from turnkeep.schemas.policy import CompletionDelta, CompletionRequest
from turnkeep.schemas.rollout import RolloutRow, Segment, TurnBoundary

CALL = CompletionRequest(prompt=[1, 2, 3], max_tokens=10, temperature=0.0, stop_token_ids=[0])


def stream(turn: StreamedTurn, tokens: list[int], version: int) -> None:
    for token in tokens:
        turn.add(CompletionDelta(token_ids=[token], token_logprobs=[-0.1 * token], policy_version=version))


def journaled_turn(tmp_path, tokens: list[int], version: int = 2, every_tokens: int = 3) -> TurnJournal:
    """g1.0.0 committed two turns of policy 2, then streamed `tokens` of its third."""
    journal = TurnJournal(tmp_path, LOG_ID)
    records = TurnRecords(journal)
    commit_turns(records, "g1.0.0", [2, 2])
    progress = TurnProgress(CALL, None, "g1.0.0", 2, every_tokens=every_tokens, every_s=3600, journal=journal)
    stream(progress.turn, tokens, version)
    asyncio.run(journal.sync())
    return journal


def test_streamed_tokens_are_journaled_in_chunks_and_continue_the_turn(tmp_path):
    journal = journaled_turn(tmp_path, [5, 6, 7, 8, 9, 4, 3])  # two chunks of 3; the 7th token is still pending
    saved = newest_boundaries(tmp_path, LOG_ID, {"g1.0.0": want(2)}, asyncio.run(journal.sync()))["g1.0.0"]
    assert saved.boundary.turn_index == 2 and saved.boundary.segments == conversation([2, 2])
    assert saved.partial.token_ids == [5, 6, 7, 8, 9, 4]
    assert saved.partial.logprobs == pytest.approx([-0.5, -0.6, -0.7, -0.8, -0.9, -0.4])
    assert (saved.partial.policy_version, saved.partial.token_versions) == (2, None)
    # The continuation asks for the rest of the turn only: the conversation plus the kept tokens.
    turn = StreamedTurn(CALL, saved.partial)
    rest = turn.rest()
    assert rest.prompt == [1, 2, 3, 5, 6, 7, 8, 9, 4] and rest.max_tokens == 4 and rest.stream


def test_a_chunk_torn_by_a_kill_is_dropped_whole(tmp_path):
    journal = journaled_turn(tmp_path, [5, 6, 7, 8, 9, 4], every_tokens=3)
    journal.close()
    _, newest = list_segments(tmp_path)[-1]
    newest.write_bytes(newest.read_bytes()[:-5])  # the kill landed inside the last chunk's record
    reopened = TurnJournal(tmp_path, LOG_ID)
    saved = newest_boundaries(tmp_path, LOG_ID, {"g1.0.0": want(2)}, asyncio.run(reopened.sync()))["g1.0.0"]
    assert saved.partial.token_ids == [5, 6, 7]
    reopened.close()


def test_tokens_of_a_rolled_back_policy_or_after_a_newer_boundary_are_not_continued(tmp_path):
    journal = journaled_turn(tmp_path, [5, 6, 7, 8], version=3, every_tokens=2)
    end = asyncio.run(journal.sync())
    # The restored trainer knows policy 2: the boundary after turn 2 stands, the tokens policy 3 made do not.
    saved = newest_boundaries(tmp_path, LOG_ID, {"g1.0.0": want(2)}, end)["g1.0.0"]
    assert saved.boundary.turn_index == 2 and saved.partial is None
    assert newest_boundaries(tmp_path, LOG_ID, {"g1.0.0": want(3)}, end)["g1.0.0"].partial.token_ids == [5, 6, 7, 8]
    # A turn 3 of policy 3 committed after them: a restore to policy 2 keeps turn 2, and no tokens of turn 3.
    records = TurnRecords(journal)
    records.commit(TurnBoundary(rollout_id="g1.0.0", turn_index=3, segments=conversation([2, 2, 3])),
                   request=request("g1.0.0"), env=None)
    saved = newest_boundaries(tmp_path, LOG_ID, {"g1.0.0": want(2)}, asyncio.run(journal.sync()))["g1.0.0"]
    assert saved.boundary.turn_index == 2 and saved.partial is None


def test_a_turn_finished_by_a_newer_policy_keeps_each_tokens_version_and_logprob():
    partial = Segment(kind="policy", token_ids=[5, 6], logprobs=[-0.5, -0.6], policy_version=4)
    turn = StreamedTurn(CALL, partial)
    stream(turn, [7, 0], version=5)  # the stop token ends it
    segment = turn.segment()
    assert segment.token_ids == [5, 6, 7, 0] and segment.logprobs == pytest.approx([-0.5, -0.6, -0.7, 0.0])
    assert (segment.policy_version, segment.token_versions) == (5, [4, 4, 5, 5])
    assert turn.rest() is None and turn.finish_reason == "stop" and turn.generated() == 2
    row = RolloutRow(group_id="g", sibling=0, attempt=1, reward=1.0, num_turns=1,
                     segments=[Segment(kind="prompt", token_ids=[1, 2, 3]), segment])
    # Staleness counts from the oldest token; the ratio uses each token's own generation logprob.
    assert sorted(row.policy_versions()) == [4, 5]
    other = row.model_copy(update={"sibling": 1})
    batch = build_batch([row, other], pad_id=0)
    assert batch.gen_logprobs[0, 2:6].tolist() == pytest.approx([-0.5, -0.6, -0.7, 0.0])
    assert batch.loss_mask[0].tolist() == [0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="token_versions has 1 versions for 2 tokens"):
        Segment(kind="policy", token_ids=[5, 6], logprobs=[-0.5, -0.6], policy_version=4, token_versions=[4])
