"""Made-up conversations shaped like the calc task's: what parked agents and data-plane rows hold.

Sizes follow a short tool-using rollout: a prompt of 12 tokens, then per turn a policy
segment of 8 tokens (with logprobs and the policy version) and a tool result of 4.
Token ids and logprobs are random, so the JSON a snapshot writes is as large as a real
one's (small repeated numbers would compress the file and flatter the benchmark).
"""

from __future__ import annotations

import random
import struct

from turnkeep.envs.calc_task import CalcCall, expected_calls
from turnkeep.schemas.rollout import Problem, RolloutRow, Segment

PROMPT_TOKENS = 12
POLICY_TOKENS = 8
TOOL_TOKENS = 4
POLICY_VERSION = 1


def chain_problem(rng: random.Random, turns: int) -> Problem:
    """A sum of `turns + 1` operands: a perfect agent needs exactly `turns` calculator calls."""
    operands = [rng.randint(1, 99) for _ in range(turns + 1)]
    return Problem(question="Q " + "+".join(map(str, operands)), answer=sum(operands))


def tool_turns(problem: Problem) -> list[str]:
    """The policy turns of a perfect agent before its final answer (one calculator call each)."""
    calls: list[CalcCall] = expected_calls(problem)
    return [call.text() for call in calls]


def conversation(rng: random.Random, turns: int, version: int = POLICY_VERSION) -> list[Segment]:
    """Prompt, then `turns` pairs of (policy, tool) segments."""
    segments = [Segment(kind="prompt", token_ids=_token_ids(rng, PROMPT_TOKENS))]
    for _ in range(turns):
        segments.append(
            Segment(
                kind="policy",
                token_ids=_token_ids(rng, POLICY_TOKENS),
                logprobs=[-3.0 * rng.random() for _ in range(POLICY_TOKENS)],
                policy_version=version,
            )
        )
        segments.append(Segment(kind="tool", token_ids=_token_ids(rng, TOOL_TOKENS)))
    return segments


def finished_row(rng: random.Random, group_id: str, sibling: int, turns: int) -> RolloutRow:
    return RolloutRow(
        group_id=group_id,
        sibling=sibling,
        attempt=0,
        segments=conversation(rng, turns),
        reward=float(rng.random() < 0.5),
        num_turns=turns,
    )


def _token_ids(rng: random.Random, n: int) -> list[int]:
    # 16-bit ids (a vocabulary of 65,536, like a typical LLM's), drawn in one C call
    # instead of n randrange calls: 100k rows hold ~5M token ids.
    return list(struct.unpack(f"<{n}H", rng.randbytes(2 * n)))
