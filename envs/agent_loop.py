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

from envs.codec import TurnCodec
from envs.environment import Environment
from envs.policy_client import Policy
from envs.turn_records import TurnRecords
from schemas.policy import CompletionRequest
from schemas.rollout import RolloutOutcome, RolloutRequest, RolloutResult, RolloutRow, Segment, TurnBoundary


@dataclass(frozen=True)
class LoopLimits:
    max_turns: int
    max_tokens_per_turn: int
    max_model_len: int
    temperature: float


async def run_agent(
    request: RolloutRequest,
    env: Environment,
    codec: TurnCodec,
    policy: Policy,
    records: TurnRecords,
    park: Callable[[], Awaitable[None]],
    limits: LoopLimits,
    start: TurnBoundary | None = None,
    on_turn: Callable[[int, Segment], None] | None = None,
) -> RolloutResult:
    """Run the episode; with `start` (a restored boundary, env already restored) continue after it.

    `on_turn(turn_index, policy_segment)` is told of every committed turn (the audit log).
    """
    if start is None:
        segments = [Segment(kind="prompt", token_ids=codec.conversation_start(env.prompt(), env.tools()))]
        first_turn = 0
    else:
        segments = list(start.segments)
        first_turn = start.turn_index
    outcome, reason = RolloutOutcome.TRUNCATED, f"no final answer within max_turns={limits.max_turns}"
    if start is not None and start.done:
        # The episode ended at the saved boundary (a crash came before its row was stored): score it, generate nothing.
        outcome, reason, first_turn = RolloutOutcome.FINISHED, "", limits.max_turns
    for turn in range(first_turn, limits.max_turns):
        context = [tok for seg in segments for tok in seg.token_ids]
        budget = min(limits.max_tokens_per_turn, limits.max_model_len - len(context))
        if budget <= 0:
            reason = f"conversation reached max_model_len={limits.max_model_len}"
            break
        completion = await policy.complete(
            CompletionRequest(
                prompt=context,
                max_tokens=budget,
                temperature=limits.temperature,
                stop_token_ids=codec.stop_ids,
            ),
            rollout_id=request.rollout_id,
        )
        choice = completion.choices[0]
        turn_segment = Segment(
            kind="policy",
            token_ids=choice.token_ids,
            logprobs=choice.logprobs.token_logprobs,
            policy_version=completion.policy_version,
        )
        segments.append(turn_segment)
        step = await env.step(codec.turn_text(choice.token_ids))
        glue = codec.after_turn(choice.token_ids, step.observation, step.role, step.done)
        if glue:
            segments.append(Segment(kind="tool", token_ids=glue))
        boundary = TurnBoundary(rollout_id=request.rollout_id, turn_index=turn + 1, segments=segments, done=step.done)
        records.commit(boundary, request=request, env=env)
        if on_turn is not None:
            on_turn(turn + 1, turn_segment)
        if step.done:
            outcome, reason = RolloutOutcome.FINISHED, ""
            break
        await park()
    row = RolloutRow(
        group_id=request.group_id,
        sibling=request.sibling,
        attempt=request.attempt,
        segments=segments,
        reward=env.reward(),
        num_turns=sum(seg.kind == "policy" for seg in segments),
    )
    return RolloutResult(rollout_id=request.rollout_id, outcome=outcome, reason=reason, row=row)
