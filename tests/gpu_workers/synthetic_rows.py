"""Made-up rollout rows for trainer tests: groups of two siblings (rewards 0 and 1), a 8-token prompt and a policy
turn each, the row i `widths[i]` tokens long in all."""

from __future__ import annotations

from turnkeep.schemas.rollout import RolloutRow, Segment


def synthetic_rows(widths: list[int]) -> list[RolloutRow]:
    return [RolloutRow(
        group_id=f"g{i // 2}", sibling=i % 2, attempt=0, reward=float(i % 2), num_turns=1,
        segments=[Segment(kind="prompt", token_ids=[1] + [3 + (i + t) % 20 for t in range(7)]),
                  Segment(kind="policy", token_ids=[3 + (i * t) % 20 for t in range(width - 8)],
                          logprobs=[-1.5] * (width - 8), policy_version=0)],
    ) for i, width in enumerate(widths)]
