"""The calc task scored by a pairwise judge over a whole group of siblings.

A comparative reward makes every sibling's reward depend on all the others, so one
failed sibling cannot be retried alone: its group must be rerun and scored together.
This environment exists to exercise that `group_scored` path with the same task.
"""

from __future__ import annotations

from turnkeep.envs.calc_env import CalcEnvironment
from turnkeep.envs.calc_task import score
from turnkeep.schemas.rollout import Problem


class JudgeEnvironment(CalcEnvironment):
    """Each sibling plays plain calc; `reward()` is only its preliminary, `score_group` decides."""

    kind = "judge"
    recovery_mode = "stateless"
    group_scored = True

    @classmethod
    def score_group(cls, problem: Problem, sibling_turns: list[list[str]]) -> list[float]:
        """Each sibling's share of its pairwise wins over the others.

        A higher `score` wins, then fewer turns; equal on both is a tie, worth half a win.
        """
        n = len(sibling_turns)
        if n < 2:
            raise ValueError(f"a pairwise judge needs at least 2 siblings, got {n}")
        # Compared as tuples: a higher score wins, then fewer turns (hence the minus); equal keys tie.
        keys = [(score(problem, turns), -len(turns)) for turns in sibling_turns]
        return [
            sum(_points(mine, other) for j, other in enumerate(keys) if j != i) / (n - 1)
            for i, mine in enumerate(keys)
        ]


def _points(mine: tuple[float, int], other: tuple[float, int]) -> float:
    return 1.0 if mine > other else 0.5 if mine == other else 0.0
