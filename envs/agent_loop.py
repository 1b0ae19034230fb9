"""The multi-turn agent loop: policy turn -> tool -> turn boundary record, until done.

The conversation is the model's chat template, extended turn by turn without ever
re-tokenising what is already there (`envs/codec.py`): a `prompt` segment (the first
user message and the generation prompt), then per turn a `policy` segment (the ids the
policy generated, through the end-of-turn token it stopped on; trained on) and, when
anything follows it, one `tool` segment: every token of template glue up to the next
generation (the end-of-turn tokens that close a turn cut by max_tokens, the
observation's message, whichever its role, and the next generation prompt). `tool`
segments are never trained on.

After every completed turn (the policy's turn and its tool result) the loop commits a
turn boundary record and then awaits `park()`: the server parks the agent there while
a checkpoint holds its boundary gate, so agents stop exactly at boundaries and a
running tool call finishes first. An agent that has passed the gate finishes its
whole next turn, policy call included, before it parks again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.environment import Environment
from turnkeep.envs.policy_client import Policy
from turnkeep.envs.turn_journal import TurnJournal
from turnkeep.envs.turn_progress import ChunkListener, TurnProgress
from turnkeep.envs.turn_records import TurnRecords
from turnkeep.schemas.environments import RolloutLimits
from turnkeep.schemas.policy import CompletionRequest, CompletionResponse
from turnkeep.schemas.rollout import RolloutOutcome, RolloutRequest, RolloutResult, RolloutRow, Segment, TurnBoundary


@dataclass(frozen=True)
class LoopLimits:
    """One episode's limits: the run's (`RolloutLimits`) as they apply to its environment (`for_environment`)."""

    max_turns: int
    max_tokens_per_turn: int
    max_model_len: int
    temperature: float
    stream_turns: bool = False
    """Stream each turn and report its progress in chunks (`TurnProgress`)."""
    journal_partial_turns: bool = False
    """Journal those chunks too: the `token` level."""
    partial_every_tokens: int = 32
    partial_every_s: float = 0.25


def for_environment(limits: RolloutLimits, environment: str) -> LoopLimits:
    """The run's limits for an episode of `environment` (at the `token` level or not)."""
    tokens = environment in limits.partial_turn_environments
    return LoopLimits(max_turns=limits.max_turns, max_tokens_per_turn=limits.max_tokens_per_turn,
                      max_model_len=limits.max_model_len, temperature=limits.temperature,
                      stream_turns=limits.stream_turns or tokens, journal_partial_turns=tokens,
                      partial_every_tokens=limits.partial_every_tokens, partial_every_s=limits.partial_every_s)


async def run_agent(
    request: RolloutRequest,
    env: Environment,
    codec: TurnCodec,
    policy: Policy,
    records: TurnRecords,
    park: Callable[[], Awaitable[None]],
    limits: LoopLimits,
    start: TurnBoundary | None = None,
    on_turn: Callable[[int, Segment, int], None] | None = None,
    partial: Segment | None = None,
    on_chunk: ChunkListener | None = None,
) -> RolloutResult:
    """Run the episode; with `start` (a restored boundary, env already restored) continue after it, and with
    `partial` (tokens of the next turn a crash cut) continue that turn from them.

    `on_turn(turn_index, policy_segment, carried)` is told of every committed turn (the audit log; `carried`:
    its tokens a cut attempt generated); `on_chunk` of each chunk of a streaming turn (`envs.turn_progress`).
    """
    streams = limits.stream_turns or limits.journal_partial_turns or partial is not None
    journal = records.journal if limits.journal_partial_turns else None
    await env.begin()
    segments, first_turn = _opening(request, env, codec, start, journal)
    outcome, reason = RolloutOutcome.TRUNCATED, f"no final answer within max_turns={limits.max_turns}"
    if start is not None and start.done:
        # The episode ended at the saved boundary (a crash came before its row was stored): score it, generate nothing.
        outcome, reason, first_turn = RolloutOutcome.FINISHED, "", limits.max_turns
    for turn in range(first_turn, limits.max_turns):
        call = _turn_call(segments, codec, limits)
        if call is None:
            reason = f"conversation reached max_model_len={limits.max_model_len}"
            break
        carried = len(partial.token_ids) if partial is not None else 0
        if streams:
            turn_segment = await _streamed_turn(call, policy, limits, request.rollout_id, turn, partial,
                                                journal, on_chunk)
            partial = None  # only the first turn after a restore was cut
        else:
            turn_segment = _whole_turn(await policy.complete(call, rollout_id=request.rollout_id))
        done = await _step_and_commit(request, env, codec, records, segments, turn, turn_segment)
        if on_turn is not None:
            on_turn(turn + 1, turn_segment, carried)
        if done:
            outcome, reason = RolloutOutcome.FINISHED, ""
            break
        await park()
    return _result(request, env, segments, outcome, reason)


def _opening(request: RolloutRequest, env: Environment, codec: TurnCodec, start: TurnBoundary | None,
             journal: TurnJournal | None) -> tuple[list[Segment], int]:
    """The conversation so far and the turn to generate next: the prompt alone, or a restored boundary's."""
    if start is not None:
        return list(start.segments), start.turn_index
    opening = codec.conversation_start(env.prompt(), env.tools(), env.system_prompt())
    segments = [Segment(kind="prompt", token_ids=opening)]
    if journal is not None:
        # The first turn's tokens need the conversation's opening record to hang on.
        opening = TurnBoundary(rollout_id=request.rollout_id, turn_index=0, segments=segments)
        journal.committed(request, opening, env.export_state(), False)
    return segments, 0


def _turn_call(segments: list[Segment], codec: TurnCodec, limits: LoopLimits) -> CompletionRequest | None:
    """The policy call for the next turn over the whole conversation; None when no token fits max_model_len."""
    context = [tok for seg in segments for tok in seg.token_ids]
    budget = min(limits.max_tokens_per_turn, limits.max_model_len - len(context))
    if budget <= 0:
        return None
    return CompletionRequest(prompt=context, max_tokens=budget, temperature=limits.temperature,
                             stop_token_ids=codec.stop_ids, stream_chunk_tokens=limits.partial_every_tokens,
                             stream_chunk_s=limits.partial_every_s)


async def _step_and_commit(request: RolloutRequest, env: Environment, codec: TurnCodec, records: TurnRecords,
                           segments: list[Segment], turn: int, turn_segment: Segment) -> bool:
    """Hand the policy's turn to the environment, append it and its tool glue to `segments` and commit the turn
    boundary; whether the episode is done."""
    segments.append(turn_segment)
    step = await env.step(codec.turn_text(turn_segment.token_ids))
    glue = codec.after_turn(turn_segment.token_ids, step.observation, step.role, step.done)
    if glue:
        segments.append(Segment(kind="tool", token_ids=glue))
    boundary = TurnBoundary(rollout_id=request.rollout_id, turn_index=turn + 1, segments=segments, done=step.done)
    records.commit(boundary, request=request, env=env)
    return step.done


def _result(request: RolloutRequest, env: Environment, segments: list[Segment], outcome: RolloutOutcome,
            reason: str) -> RolloutResult:
    row = RolloutRow(
        group_id=request.group_id,
        sibling=request.sibling,
        attempt=request.attempt,
        segments=segments,
        reward=env.reward(),
        reward_parts=env.reward_parts(),
        num_turns=sum(seg.kind == "policy" for seg in segments),
        truncated=outcome is RolloutOutcome.TRUNCATED,
    )
    return RolloutResult(rollout_id=request.rollout_id, outcome=outcome, reason=reason, row=row)


def _whole_turn(completion: CompletionResponse) -> Segment:
    choice = completion.choices[0]
    return Segment(kind="policy", token_ids=choice.token_ids, logprobs=choice.logprobs.token_logprobs,
                   policy_version=completion.policy_version)


async def _streamed_turn(call: CompletionRequest, policy: Policy, limits: LoopLimits, rollout_id: str,
                         turn_index: int, partial: Segment | None, journal: TurnJournal | None,
                         on_chunk: ChunkListener | None) -> Segment:
    """One turn streamed, its tokens reported (and at the `token` level journaled) in chunks as they come."""
    progress = TurnProgress(call, partial, rollout_id, turn_index, limits.partial_every_tokens,
                            limits.partial_every_s, journal=journal, on_chunk=on_chunk)
    await policy.stream(progress.turn, rollout_id=rollout_id)
    return progress.turn.segment()
